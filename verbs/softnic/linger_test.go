package softnic_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
)

// TestWaitersWithoutDriveStopLinger: after a driven READ the link lingers
// (its socket out of the receive goroutine's epoll set). ConnectRC then
// waits for the CM reply without driving; unless it ends the linger, the
// reply waits in the socket until the linger lapses, which counts a
// linger miss and turns lingering off for a second, so every synchronous
// READ of the next second pays two epoll_ctl calls (the in-process READ
// benchmark at 1.6x the ping-pong instead of 1.28x whenever qpcore's RC
// connection attempt is rejected while a ping-pong chunk runs).
func TestWaitersWithoutDriveStopLinger(t *testing.T) {
	t.Run("cm", func(t *testing.T) { waitersStopLinger(t, nil) })
	// With a cluster key, a ConnectRC to a peer without a session first
	// waits for the session handshake's answer, also without driving.
	t.Run("handshake", func(t *testing.T) { waitersStopLinger(t, []byte("cluster secret 16+")) })
}

func waitersStopLinger(t *testing.T, key []byte) {
	fb := newFabric(t, "udp", faults{})
	mk := func() *node {
		if key == nil {
			return fb.node()
		}
		return keyedNodeCfg(fb, softnic.Config{ClusterKey: key})
	}
	srv, cli := mk(), mk()
	qa, _ := connect(t, cli, srv, 200*time.Millisecond)
	cq := cli.cq.(verbs.DrivenCQ)
	ctx := context.Background()
	wcs := make([]verbs.WC, 4)
	read := func() {
		var fin atomic.Bool
		if err := qa.PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled,
			Local: verbs.SGE{MR: cli.mr, Length: 8}, RKey: srv.mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
		ready := func() bool {
			if cq.Poll(wcs) > 0 {
				fin.Store(true)
			}
			return fin.Load()
		}
		if err := cq.Drive(ctx, nil, ready); err != nil {
			t.Fatal(err)
		}
	}
	misses := softnic.LinkCounters(cli.dev).LingerMisses
	stopped := false
	for i := 0; i < 20 && !stopped; i++ {
		to := srv
		if key != nil {
			to = mk() // a peer without a session: ConnectRC shakes hands first
		}
		read() // the link lingers after the last driver leaves
		stops := softnic.LinkCounters(cli.dev).LingerStops
		q := cli.rcQP()
		_, err := cli.dev.ConnectRC(ctx, q, to.dev.Addr(), 0xdead0000+uint32(i), verbs.ConnParams{})
		if !errors.Is(err, verbs.ErrCMRejected) {
			t.Fatalf("ConnectRC to a service nobody listens on: %v, want ErrCMRejected", err)
		}
		q.Destroy()
		stopped = softnic.LinkCounters(cli.dev).LingerStops > stops
	}
	if !stopped {
		t.Fatal("20 ConnectRCs right after a driven READ never ended the link's linger")
	}
	if got := softnic.LinkCounters(cli.dev).LingerMisses; got != misses {
		t.Fatalf("linger misses went from %d to %d", misses, got)
	}
}

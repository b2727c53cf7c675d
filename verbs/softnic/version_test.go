package softnic_test

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// v1CMReq is a connection request as a wire-version-1 node sent it (base
// header, 24-byte CMETH without a cookie, private data).
func v1CMReq(service uint32, connID uint64) []byte {
	be := binary.BigEndian
	b := []byte{wire.Magic, 1, byte(wire.OpCMReq), 0}
	b = be.AppendUint32(b, 0)
	b = be.AppendUint32(b, 5)
	b = be.AppendUint32(b, 0)
	for _, v := range []uint32{service, 5, 1, 4096} {
		b = be.AppendUint32(b, v)
	}
	return append(be.AppendUint64(b, connID), "old node"...)
}

// TestOldWireVersionRefused: a device drops packets of another wire
// version before reading them, and counts them (BadVersion, within
// Malformed). Without a cluster key, a version-1 connection request is
// answered with a version-1 CM_REJ carrying the version needed, so an old
// node's connect fails with that reason; nothing reaches the listener.
// With a key nothing unauthenticated is answered.
func TestOldWireVersionRefused(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "nokey", true: "key"}[keyed], func(t *testing.T) {
			fb := newFabric(t, "fake", faults{})
			var cfg softnic.Config
			if keyed {
				cfg.ClusterKey = []byte("cluster secret 16+")
			}
			b := keyedNodeCfg(fb, cfg)
			var accepts atomic.Int64
			const svc = 0x77
			if err := b.dev.ListenRC(svc, func(verbs.ConnRequest) (verbs.QP, []byte, error) {
				accepts.Add(1)
				return b.rcQP(), nil, nil
			}); err != nil {
				t.Fatal(err)
			}
			old := fb.net.NewLink() // a version-1 node's socket
			var mu sync.Mutex
			var replies [][]byte
			old.Start(recvFunc(func(_ netip.AddrPort, hdr, payload []byte) {
				mu.Lock()
				replies = append(replies, append(append([]byte(nil), hdr...), payload...))
				mu.Unlock()
			}))
			before := b.dev.Stats()
			fb.net.Inject(old.LocalAddr(), b.dev.Addr(), v1CMReq(svc, 0xabcdef))
			read := append([]byte{wire.Magic, 1, byte(wire.OpReadReq), 0}, make([]byte, 40)...)
			fb.net.Inject(old.LocalAddr(), b.dev.Addr(), read)
			fb.net.Flush()
			b.dev.SyncMemory()
			fb.net.Flush()

			st := b.dev.Stats()
			if d := st.BadVersion - before.BadVersion; d != 2 {
				t.Fatalf("BadVersion +%d, want 2 (a CM_REQ and a READ of version 1)", d)
			}
			if st.Malformed-before.Malformed != 2 {
				t.Fatalf("Malformed +%d, want 2", st.Malformed-before.Malformed)
			}
			if accepts.Load() != 0 || b.dev.CMStats().Records != 0 || b.dev.CMStats().CookiesSent != 0 {
				t.Fatalf("a version-1 request reached the CM: %d accepts, %+v", accepts.Load(), b.dev.CMStats())
			}
			mu.Lock()
			defer mu.Unlock()
			if keyed {
				if len(replies) != 0 {
					t.Fatalf("keyed device answered an unauthenticated old packet: % x", replies)
				}
				return
			}
			if len(replies) != 1 {
				t.Fatalf("%d replies to a version-1 CM_REQ and READ, want one refusal", len(replies))
			}
			r := replies[0]
			if len(r) < wire.BaseLen+24 || r[1] != 1 || wire.Opcode(r[2]) != wire.OpCMRej ||
				binary.BigEndian.Uint64(r[wire.BaseLen+16:]) != 0xabcdef || string(r[wire.BaseLen+24:]) != wire.VersionRefusalReason {
				t.Fatalf("reply is not a version-1 CM_REJ of the request: % x", r)
			}
		})
	}
}

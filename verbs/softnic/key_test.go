package softnic_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
)

// keyedNode is fabric.node with a cluster key.
func (fb *fabric) keyedNode(key []byte) *node {
	t := fb.t
	dev, err := softnic.Open(softnic.Config{Link: fb.link(), Clock: fb.clock, ClusterKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(4096)
	mem := make([]byte, memSize)
	mr, err := pd.RegMR(mem, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	return &node{t: t, dev: dev, pd: pd, cq: cq, mem: mem, mr: mr}
}

// TestClusterKey: nodes sharing a cluster key work as usual; a node with
// another key, or none, that knows the rkey, the DCT number and the DC key
// still cannot read or write, and its packets are counted.
func TestClusterKey(t *testing.T) {
	forEachFabric(t, faults{}, func(t *testing.T, fb *fabric) {
		key := []byte("cluster secret")
		a, b := fb.keyedNode(key), fb.keyedNode(key)
		qa, _ := connect(t, a, b, 0)
		copy(a.mem[100:], "authenticated")
		a.dev.SyncMemory()
		post(t, qa,
			verbs.SendWR{Op: verbs.OpWrite, Local: sge(a, 100, 13), RemoteAddr: 200, RKey: b.mr.RKey()},
			verbs.SendWR{Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 4096, 3*4096), RemoteAddr: 0, RKey: b.mr.RKey()})
		if wc := poll(t, a.cq, 1, 5*time.Second)[0]; wc.Err() != nil {
			t.Fatal(wc.Err())
		}
		b.dev.SyncMemory()
		if string(b.mem[200:213]) != "authenticated" || !bytes.Equal(a.mem[4096+200:4096+213], b.mem[200:213]) {
			t.Fatal("keyed WRITE/READ failed")
		}
		dct, _ := b.dct(55)
		copy(b.mem[8192:], "secret data")
		b.dev.SyncMemory()
		for _, outsider := range []*node{fb.node(), fb.keyedNode([]byte("wrong key"))} {
			before := b.dev.Stats().BadMAC
			dci := outsider.dci(2 * time.Millisecond)
			copy(outsider.mem, "evil")
			outsider.dev.SyncMemory()
			post(t, dci,
				verbs.SendWR{Op: verbs.OpWrite, Local: sge(outsider, 0, 4), RemoteAddr: 300, RKey: b.mr.RKey(), Target: target(b, dct, 55)},
				verbs.SendWR{Op: verbs.OpRead, Local: sge(outsider, 64, 11), RemoteAddr: 8192, RKey: b.mr.RKey(), Target: target(b, dct, 55)})
			wcs := poll(t, outsider.cq, 2, 5*time.Second)
			if wcs[0].Status != verbs.StatusRetryExcErr {
				t.Fatalf("outsider's WRITE: %+v", wcs[0])
			}
			b.dev.SyncMemory()
			outsider.dev.SyncMemory()
			if string(b.mem[300:304]) == "evil" || string(outsider.mem[64:75]) == "secret data" {
				t.Fatal("a node without the cluster key read or wrote memory")
			}
			if got := b.dev.Stats().BadMAC - before; got == 0 {
				t.Fatal("rejected packets were not counted")
			}
		}
	})
}

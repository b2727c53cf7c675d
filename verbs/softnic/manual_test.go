package softnic_test

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// newManualFabric is the fake network on a manual clock that nothing but
// its driver moves: a goroutine that delivers every packet and fires
// every timer, jumping time to the next event only when nothing is due
// now. Deliveries, the responders' answers and the requesters' ACK
// processing all run on the driver; a retransmission timer fires only for
// a packet the network really lost, however busy the machine is. Stop the
// driver (the returned func) before the test ends; cleanup does too.
func newManualFabric(t testing.TB, f faults) (*fabric, func()) {
	clk := softnictest.NewManualClock(time.Time{})
	fb := &fabric{name: "fake", t: t, f: f, seed: 1, clock: clk}
	fb.net = softnictest.NewNetwork(softnictest.Config{Seed: 42, Drop: f.drop, Dup: f.dup, Reorder: f.reorder,
		ReorderDelay: 200 * time.Microsecond, Coalesce: coalesce, Clock: clk})
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			default:
			}
			if !clk.RunNext() {
				runtime.Gosched() // nothing pending: let the clients post
			}
		}
	}()
	var once sync.Once
	stop := func() { once.Do(func() { close(quit); <-done }) }
	t.Cleanup(func() {
		stop()
		fb.net.Close()
	})
	return fb, stop
}

package softnictest_test

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// printer is a minimal link.Receiver.
type printer struct{ clock link.Clock }

func (printer) RxLock()   {}
func (printer) RxUnlock() {}
func (printer) Steer(netip.AddrPort, []byte, int, int) []byte {
	return nil // no zero-copy placement: payloads land in scratch
}
func (p printer) Deliver(from netip.AddrPort, hdr, payload []byte) {
	h, _, err := wire.Parse(hdr)
	if err != nil {
		fmt.Println("malformed packet:", err)
		return
	}
	fmt.Printf("%v: %v PSN %d %q from %v\n", p.clock.Now().Sub(softnictest.Epoch), h.Op, h.PSN, payload, from)
}

func Example() {
	clk := softnictest.NewManualClock(time.Time{})
	n := softnictest.NewNetwork(softnictest.Config{Seed: 1, Delay: time.Millisecond, Clock: clk})
	defer n.Close()

	a, b := n.NewLink(), n.NewLink()
	a.Start(printer{n.Clock()})
	b.Start(printer{n.Clock()})

	// Lose every packet with PSN 2.
	n.SetFilter(func(_, _ netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
		if h.PSN == 2 {
			return softnictest.Drop
		}
		return softnictest.Pass
	})

	var pkts []link.Packet
	for psn := range uint32(4) {
		h := wire.Header{Op: wire.OpSend, Flags: wire.FlagFirst | wire.FlagLast, DestQP: 1, SrcQP: 1, PSN: psn}
		pkts = append(pkts, link.Packet{To: b.LocalAddr(), Hdr: h.Append(nil), Payload: []byte("hi")})
	}
	a.Send(pkts)
	n.Inject(a.LocalAddr(), b.LocalAddr(), []byte("this is not a softnic packet"))

	n.Flush() // delivers what is due now: the injected packet
	clk.Advance(time.Millisecond)
	c := n.Counters()
	fmt.Printf("sent %d, injected %d, delivered %d, dropped %d, malformed %d\n",
		c.Sent, c.Injected, c.Delivered, c.Dropped, c.Malformed)
	// Output:
	// malformed packet: wire: bad magic
	// 1ms: SEND PSN 0 "hi" from 127.0.0.1:20000
	// 1ms: SEND PSN 1 "hi" from 127.0.0.1:20000
	// 1ms: SEND PSN 3 "hi" from 127.0.0.1:20000
	// sent 4, injected 1, delivered 4, dropped 1, malformed 1
}

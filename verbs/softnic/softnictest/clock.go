package softnictest

import (
	"time"

	"github.com/krfs/krfs/clock/clocktest"
)

// Epoch is the time at which a ManualClock created from the zero time
// starts (clocktest.Epoch).
var Epoch = clocktest.Epoch

// ManualClock is the manual clock of package clocktest. A Network built on
// one attaches to it: packet deliveries are events of the clock, run in
// time order with its timers (a packet due at the same instant as a timer
// is delivered first), and time does not move while any delivery is in
// progress, on whatever goroutine (an AutoFlush link's included), so a
// Receiver's answers go out at the instant its packet was due. A Receiver
// must therefore not call Advance or RunNext.
type ManualClock = clocktest.Manual

// NewManualClock returns a manual clock reading start, or Epoch if start
// is the zero time.
func NewManualClock(start time.Time) *ManualClock { return clocktest.NewManual(start) }

// clockSource makes a Network's deliveries events of its manual clock
// (clocktest.Source).
type clockSource struct{ n *Network }

func (s clockSource) NextDue() (time.Time, bool) { return s.n.nextDue() }
func (s clockSource) RunDue(now time.Time)       { s.n.deliverDue(now) }

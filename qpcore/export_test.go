package qpcore

import "time"

// HousekeptAt returns the clock time of n's last housekeeping (or of its
// dispatcher's start), and whether n is still open: a test that moves a
// manual clock waits until every open node housekept within one Tick of
// the clock's time.
func (n *Node) HousekeptAt() (at time.Time, open bool) {
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	return time.Unix(0, n.housekept.Load()), !closed
}

package qpcore

import (
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// Peer liveness as a state machine: down only after deathStrikes silent
// attempts spanning deathStrikes attempts of time, a probe per attempt
// while down, and up again at the first answer.
func TestLivenessStates(t *testing.T) {
	c := softnictest.NewManualClock(time.Unix(1000, 0))
	const attempt = 100 * time.Millisecond
	var l liveness
	// Two QP errors at once are one silence: not dead.
	for range deathStrikes {
		if l.struck(c.Now(), attempt) {
			t.Fatal("dead within one attempt of silence")
		}
	}
	if l.strikes != deathStrikes {
		t.Fatalf("strikes %d", l.strikes)
	}
	if l.refuses(c, true) {
		t.Fatal("refusing while up")
	}
	c.Advance(deathStrikes * attempt)
	if !l.struck(c.Now(), attempt) || !l.down {
		t.Fatal("not dead after the silence spanned deathStrikes attempts")
	}
	if l.struck(c.Now(), attempt) {
		t.Fatal("declared dead twice")
	}
	// Down: nothing but one probe per attempt, and none while busy.
	if !l.refuses(c, false) {
		t.Fatal("a probe admitted less than an attempt after the death")
	}
	c.Advance(attempt)
	if !l.refuses(c, true) || l.refuses(c, false) {
		t.Fatal("probe rules: busy must refuse, idle must admit")
	}
	l.admitted(c, attempt)
	if !l.refuses(c, false) {
		t.Fatal("a second probe within the attempt")
	}
	if !l.answered() || l.down || l.strikes != 0 || l.refuses(c, true) {
		t.Fatal("an answer did not bring the peer up")
	}
	if l.answered() {
		t.Fatal("came up twice")
	}
	l.struck(c.Now(), attempt)
	if !l.firstSilence() {
		t.Fatal("the first silence after an answer")
	}
}

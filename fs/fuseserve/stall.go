package fuseserve

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A stalled mount: the kernel holds a request for it (the connection's
// waiting count in fusectl, /sys/fs/fuse/connections/N/waiting) while the
// server has none in service and serves none. On the classic /dev/fuse
// loop that cannot last: the loop reads whatever the kernel queues. Over
// io_uring a request the kernel queued on a CPU whose entries were all
// busy is handed out only when one of that queue's entries commits; a
// queue that lost entries waits for good, and so does a request whose
// completion the server dropped (a queue's setup once did: see
// takeSetupCompletions; the nudge below cannot free that one, an abort
// through fusectl can). The watch logs a stall once it lasted stallTicks
// checks (counted in Stats.Stalls) and nudges every CPU's queue: a lookup
// from a thread on that CPU takes a free entry, and its commit fetches
// whatever the queue holds.

// stallEvery is how often the watch checks; stallTicks checks in a row
// make a stall.
const (
	stallEvery = 10 * time.Second
	stallTicks = 3
)

// stallWatch decides, check by check, whether a mount stalled. It is the
// watch's pure core (no clock, no files).
type stallWatch struct {
	served uint64 // requests served at the last check
	quiet  int    // checks in a row with requests waiting and none served
}

// check takes the kernel's waiting count, the requests in service and the
// requests served so far, and reports whether the mount has now been
// stalled for stallTicks checks in a row (then it starts counting anew).
func (w *stallWatch) check(waiting, inService int64, served uint64) bool {
	if waiting > 0 && inService <= 0 && served == w.served {
		w.quiet++
	} else {
		w.quiet = 0
	}
	w.served = served
	if w.quiet >= stallTicks {
		w.quiet = 0
		return true
	}
	return false
}

// fusectlWaiting returns the file with the waiting count of the FUSE
// connection mounted at dir, or "" when fusectl is not mounted.
func fusectlWaiting(dir string) string {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return ""
	}
	f := filepath.Join("/sys/fs/fuse/connections", strconv.FormatUint(uint64(unix.Minor(st.Dev)), 10), "waiting")
	if _, err := os.Stat(f); err != nil {
		return ""
	}
	return f
}

// watchStalls runs until the server stops (see stallWatch).
func (s *Server) watchStalls(waitingFile string) {
	defer s.wg.Done()
	t := time.NewTicker(stallEvery)
	defer t.Stop()
	var w stallWatch
	var nudging atomic.Bool
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		b, err := os.ReadFile(waitingFile)
		if err != nil {
			return // the connection is gone
		}
		waiting, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return
		}
		served := s.devReqs.Load() + s.ringReqs.Load()
		if !w.check(waiting, s.inService.Load(), served) {
			continue
		}
		s.stalls.Add(1)
		s.logf("FUSE mount %s stalled: the kernel holds %d request(s), none in service, none served for %v; nudging every CPU's ring queue", s.dir, waiting, stallEvery*stallTicks)
		if nudging.CompareAndSwap(false, true) {
			go func() {
				defer nudging.Store(false)
				s.nudge()
			}()
		}
	}
}

// nudge looks up a name that does not exist from a thread on every CPU,
// one CPU after the other, so that each ring queue serves a request.
func (s *Server) nudge() {
	runtime.LockOSThread() // the thread ends with the goroutine: its affinity goes with it
	for cpu := range s.cpus {
		var set unix.CPUSet
		set.Set(cpu)
		if unix.SchedSetaffinity(0, &set) != nil {
			continue
		}
		_, _ = os.Stat(filepath.Join(s.dir, fmt.Sprintf(".krfs-nudge-%d-%d", s.stalls.Load(), cpu)))
	}
}

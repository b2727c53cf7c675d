// Package leaktest fails a test that leaves goroutines behind.
//
// Call Check first thing in a test:
//
//	func TestDevice(t *testing.T) {
//		leaktest.Check(t)
//		d := newDevice(t)
//		...
//	}
//
// Check notes the goroutines that exist when it is called. When the test
// and its earlier-registered cleanups have finished (Check's cleanup is
// registered first, so it runs last), it waits up to a minute (DefaultTimeout) for
// every goroutine started since to exit, and fails the test with the
// stacks of those that remain. Goroutines of the runtime and of the
// testing package (other tests' goroutines, the alarm, signal handling)
// are ignored.
//
// Goroutines are told apart by their IDs in runtime.Stack output, so a
// goroutine that existed at the start is never reported, even if it is
// still running. Tests that run in parallel with t.Parallel start
// goroutines the checker cannot attribute to one test; do not combine
// Check with t.Parallel in the same package.
package leaktest

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// DefaultTimeout is how long Check waits for goroutines to exit: long,
// because goroutines that end promptly on an idle machine can wait seconds
// for a CPU on a loaded one; a real leak costs only the wait.
const DefaultTimeout = time.Minute

// Check fails t if goroutines started after the call still run when the
// test ends (see the package doc).
func Check(t testing.TB) {
	t.Helper()
	CheckTimeout(t, DefaultTimeout)
}

// CheckTimeout is Check with a chosen wait for goroutines to exit.
func CheckTimeout(t testing.TB, timeout time.Duration) {
	t.Helper()
	before := make(map[int64]bool)
	for _, g := range goroutines() {
		before[g.id] = true
	}
	t.Cleanup(func() {
		deadline := time.Now().Add(timeout)
		pause := time.Millisecond
		for {
			leaked := leaks(before)
			if len(leaked) == 0 {
				return
			}
			if !time.Now().Before(deadline) {
				var b strings.Builder
				fmt.Fprintf(&b, "leaktest: %d goroutine(s) still running %v after the test:", len(leaked), timeout)
				for _, g := range leaked {
					b.WriteString("\n\n")
					b.WriteString(g.stack)
				}
				t.Errorf("%s", b.String())
				return
			}
			time.Sleep(pause)
			pause = min(2*pause, 100*time.Millisecond)
		}
	})
}

// goroutine is one entry of a runtime.Stack(all) dump.
type goroutine struct {
	id    int64
	entry string // function the goroutine started in (the bottom frame)
	stack string // the entry's text
}

// leaks returns the goroutines that are not in before, not the caller and
// not ignored.
func leaks(before map[int64]bool) []goroutine {
	self := currentID()
	var out []goroutine
	for _, g := range goroutines() {
		if !before[g.id] && g.id != self && !ignored(g) {
			out = append(out, g)
		}
	}
	return out
}

// ignoredEntries are prefixes of entry functions of goroutines that
// belong to the runtime or the testing package rather than to a test.
var ignoredEntries = []string{
	"runtime.",
	"testing.",
	"os/signal.",
	"runtime/trace.",
}

func ignored(g goroutine) bool {
	for _, p := range ignoredEntries {
		if strings.HasPrefix(g.entry, p) {
			return true
		}
	}
	return false
}

// goroutines returns every goroutine of the program.
func goroutines() []goroutine {
	buf := make([]byte, 64<<10)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return parseStacks(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// currentID returns the calling goroutine's ID.
func currentID() int64 {
	buf := make([]byte, 128)
	buf = buf[:runtime.Stack(buf, false)]
	if gs := parseStacks(buf); len(gs) > 0 {
		return gs[0].id
	}
	return -1
}

// parseStacks splits a runtime.Stack dump into goroutines. Each entry
// reads:
//
//	goroutine 18 [chan receive, 2 minutes]:
//	pkg.function(args...)
//		/path/file.go:12 +0x1d
//	...
//	created by pkg.starter in goroutine 7
//		/path/file.go:30 +0x5a
//
// Entries are separated by blank lines. Entries that do not start with a
// goroutine header are skipped.
func parseStacks(dump []byte) []goroutine {
	var out []goroutine
	for entry := range bytes.SplitSeq(dump, []byte("\n\n")) {
		text := strings.TrimSpace(string(entry))
		header, frames, _ := strings.Cut(text, "\n")
		rest, ok := strings.CutPrefix(header, "goroutine ")
		if !ok {
			continue
		}
		idText, _, _ := strings.Cut(rest, " ")
		id, err := strconv.ParseInt(idText, 10, 64)
		if err != nil {
			continue
		}
		out = append(out, goroutine{id: id, entry: entryFunc(frames), stack: text})
	}
	return out
}

// entryFunc returns the name of the bottom function frame of a stack: the
// last line that is not a file position (tab-indented), a "created by"
// line, an elision note, or runtime.goexit (the bottom frame of a
// goroutine that has not run yet).
func entryFunc(frames string) string {
	entry := ""
	for line := range strings.SplitSeq(frames, "\n") {
		switch {
		case line == "", strings.HasPrefix(line, "\t"),
			strings.HasPrefix(line, "created by "), strings.HasPrefix(line, "..."):
			continue
		}
		name := line
		if i := strings.LastIndexByte(name, '('); i > 0 {
			name = name[:i]
		}
		if name != "runtime.goexit" {
			entry = name
		}
	}
	return entry
}

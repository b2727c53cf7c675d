package leaktest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeTB records what Check does with a testing.TB. Methods Check does
// not use panic through the nil embedded interface.
type fakeTB struct {
	testing.TB

	mu       sync.Mutex // guards the fields below
	cleanups []func()
	errors   []string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Cleanup(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, fn)
}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

// finish runs the cleanups, last registered first, as testing does, and
// returns the reported errors.
func (f *fakeTB) finish() []string {
	f.mu.Lock()
	cleanups := f.cleanups
	f.cleanups = nil
	f.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.errors
}

// blockedLeaker parks until stop is closed; its name identifies it in
// reports.
func blockedLeaker(stop <-chan struct{}, exited *sync.WaitGroup) {
	defer exited.Done()
	<-stop
}

func TestCheckReportsLeakedGoroutine(t *testing.T) {
	fake := &fakeTB{}
	CheckTimeout(fake, 50*time.Millisecond)

	stop := make(chan struct{})
	var exited sync.WaitGroup
	exited.Add(1)
	go blockedLeaker(stop, &exited)
	defer func() {
		close(stop)
		exited.Wait()
	}()

	errs := fake.finish()
	if len(errs) != 1 {
		t.Fatalf("got %d errors, want 1: %q", len(errs), errs)
	}
	if !strings.Contains(errs[0], "1 goroutine(s)") || !strings.Contains(errs[0], "blockedLeaker") {
		t.Errorf("report does not name the one leaked goroutine:\n%s", errs[0])
	}
}

func TestCheckWaitsForExitingGoroutines(t *testing.T) {
	fake := &fakeTB{}
	CheckTimeout(fake, 2*time.Second)
	for range 3 {
		go time.Sleep(20 * time.Millisecond)
	}
	if errs := fake.finish(); len(errs) != 0 {
		t.Errorf("goroutines that exit in time were reported: %q", errs)
	}
}

func TestCheckIgnoresGoroutinesFromBefore(t *testing.T) {
	stop := make(chan struct{})
	var exited sync.WaitGroup
	exited.Add(1)
	go blockedLeaker(stop, &exited)
	defer func() {
		close(stop)
		exited.Wait()
	}()

	fake := &fakeTB{}
	CheckTimeout(fake, 50*time.Millisecond)
	if errs := fake.finish(); len(errs) != 0 {
		t.Errorf("a goroutine started before Check was reported: %q", errs)
	}
}

func TestCheckOnRealTest(t *testing.T) {
	Check(t)
	done := make(chan struct{})
	go func() { close(done) }()
	<-done
}

func TestParseStacks(t *testing.T) {
	dump := `goroutine 7 [running]:
example.com/p.TestX(0xc000102000)
	/src/p/x_test.go:10 +0x25
testing.tRunner(0xc000102000, 0x5f7b28)
	/go/src/testing/testing.go:1792 +0xf4
created by testing.(*T).Run in goroutine 1
	/go/src/testing/testing.go:1851 +0x413

goroutine 1 [chan receive, 3 minutes]:
testing.(*T).Run(0xc000102000, {0x5a1d8e, 0x5}, 0x5f7b28)
	/go/src/testing/testing.go:1859 +0x431
main.main()
	_testmain.go:45 +0x9b

goroutine 23 [select]:
example.com/p.(*worker).loop(0xc0000a4000)
	/src/p/worker.go:40 +0x8d
...additional frames elided...
created by example.com/p.start in goroutine 7
	/src/p/worker.go:20 +0x6a

goroutine 24 [runnable]:
example.com/p.start.gowrap1()
	/src/p/worker.go:21
runtime.goexit({})
	/usr/local/go/src/runtime/asm_amd64.s:1771 +0x1
created by example.com/p.start in goroutine 7
	/src/p/worker.go:21 +0x197

not a goroutine
`
	got := parseStacks([]byte(dump))
	want := []struct {
		id    int64
		entry string
	}{
		{7, "testing.tRunner"},
		{1, "main.main"},
		{23, "example.com/p.(*worker).loop"},
		{24, "example.com/p.start.gowrap1"},
	}
	if len(got) != len(want) {
		t.Fatalf("parsed %d goroutines, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].id != w.id || got[i].entry != w.entry {
			t.Errorf("goroutine %d: got id %d entry %q, want id %d entry %q", i, got[i].id, got[i].entry, w.id, w.entry)
		}
	}
	if !ignored(got[0]) || ignored(got[2]) || ignored(got[3]) {
		t.Errorf("ignored: tRunner %v (want true), worker %v, unstarted %v (want false)", ignored(got[0]), ignored(got[2]), ignored(got[3]))
	}
}

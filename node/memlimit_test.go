package node

import (
	"runtime/debug"
	"strings"
	"testing"
)

// SetMemoryLimit sets the runtime's soft limit, leaves it alone for 0,
// and defers to GOMEMLIMIT from the environment; the automatic limit is
// 64 MiB with the default 8 MiB registration cache.
func TestSetMemoryLimit(t *testing.T) {
	was := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(was)
	if got := AutoMemoryLimit(8 << 20); got != 64<<20 {
		t.Fatalf("AutoMemoryLimit(8 MiB) = %d MiB, want 64", got>>20)
	}
	t.Setenv("GOMEMLIMIT", "")
	if msg := SetMemoryLimit(80 << 20); debug.SetMemoryLimit(-1) != 80<<20 || !strings.Contains(msg, "80 MiB") {
		t.Fatalf("SetMemoryLimit(80 MiB): limit %d, %q", debug.SetMemoryLimit(-1), msg)
	}
	if msg := SetMemoryLimit(0); debug.SetMemoryLimit(-1) != 80<<20 || !strings.Contains(msg, "none") {
		t.Fatalf("SetMemoryLimit(0) changed the limit to %d or said %q", debug.SetMemoryLimit(-1), msg)
	}
	t.Setenv("GOMEMLIMIT", "100MiB")
	if msg := SetMemoryLimit(70 << 20); debug.SetMemoryLimit(-1) != 80<<20 || !strings.Contains(msg, "GOMEMLIMIT=100MiB") {
		t.Fatalf("SetMemoryLimit with GOMEMLIMIT set: limit %d, %q", debug.SetMemoryLimit(-1), msg)
	}
}

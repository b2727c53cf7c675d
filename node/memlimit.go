package node

import (
	"fmt"
	"os"
	"runtime/debug"
)

// MemLimitBase is what the automatic memory limit (AutoMemoryLimit)
// allows a daemon beyond its registration cache: 64 MiB with the default
// 8 MiB cache, the bound on a daemon's own memory. The daemon's live heap
// after heavy mixed I/O was about 40 MiB with an 8 MiB cache: go-fuse's
// request buffers (about 1 MiB per reader of /dev/fuse), the
// filesystem's I/O buffers (fs.DefaultIOBufferBytes, 8 MiB), the cache,
// qpcore's message buffers (4 MiB once a port is bound, 256 KiB before),
// the meta cache; the rest is room for garbage between collections. The
// limit counts memory the runtime has allocated, touched or not, so what
// the daemon leaves untouched (message buffers never used) leaves less
// room for garbage, and RssAnon sits lower under the same limit. A limit much closer to the live heap makes
// the collector run back to back and empties go-fuse's buffer pools,
// whose refills then need more collections (48 MiB with an 8 MiB cache:
// 1,500 collections in 20 s of 1 MiB reads and a third of the
// throughput).
const MemLimitBase = 56 << 20

// AutoMemoryLimit is the soft memory limit of a daemon whose registration
// cache holds up to cache bytes.
func AutoMemoryLimit(cache int64) int64 { return MemLimitBase + cache }

// SetMemoryLimit sets the Go runtime's soft memory limit to limit bytes
// (none if limit is 0), unless GOMEMLIMIT in the environment set one; it
// says what it did, for the log.
//
// Why a daemon needs one: go-fuse allocates a reply buffer of the
// request's page count for every READ it does not serve from the
// filesystem's I/O buffers and pools them per page count, so reads of
// assorted sizes leave garbage behind that the collector, paced by GOGC
// alone, lets grow with the heap (1 GiB of anonymous memory after a
// minute of fio). The live heap is small and bounded (the registration
// cache, the I/O buffers, go-fuse's request buffers), so a soft limit
// above it keeps the daemon's memory at the limit for little collection
// work.
func SetMemoryLimit(limit int64) string {
	if env := os.Getenv("GOMEMLIMIT"); env != "" {
		return fmt.Sprintf("memory limit: GOMEMLIMIT=%s from the environment", env)
	}
	if limit <= 0 {
		return "memory limit: none"
	}
	debug.SetMemoryLimit(limit)
	return fmt.Sprintf("memory limit: %d MiB", limit>>20)
}

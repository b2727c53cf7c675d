package main

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/fs/fuseserve"

	"github.com/krfs/krfs/internal/shm"
	"github.com/krfs/krfs/nic"
	"github.com/krfs/krfs/node"
)

// MinTimeout is the shortest --timeout accepted: an operation to a peer
// needs at least a round trip and the NIC's first retransmission, and a
// loaded host stalls a process for milliseconds; a shorter bound would
// fail healthy operations.
const MinTimeout = 10 * time.Millisecond

// validate checks every flag of krfs mount before anything starts (and
// before --daemon detaches): an error is a usage error (exit 2) in one
// line, except a default region that does not fit its filesystem. It
// returns the default region's size and the backend.
func (f *mountFlags) validate() (mem int64, backend nic.Backend, err error) {
	if _, err := f.log.logger(nil); err != nil {
		return 0, backend, err
	}
	mem, err = parseSize(f.memSize)
	if err != nil {
		return 0, backend, err
	}
	if mem < 8 || mem > shm.MaxSize {
		return 0, backend, fmt.Errorf("%w: --mem-size %s: want 8 bytes to 1T", errUsage, f.memSize)
	}
	if f.limits.maxRegionSize, err = parseSize(f.maxRegSize); err != nil || f.limits.maxRegionSize < 8 || f.limits.maxRegionSize > shm.MaxSize {
		return 0, backend, fmt.Errorf("%w: --max-region-size %s: want 8 bytes to 1T", errUsage, f.maxRegSize)
	}
	if f.limits.memCache, err = parseSize(f.memCache); err != nil || f.limits.memCache < 0 {
		return 0, backend, fmt.Errorf("%w: --mem-cache %s: want a size like 8M", errUsage, f.memCache)
	}
	if f.limits.memLimit = node.AutoMemoryLimit(f.limits.memCache); f.memLimit == "off" {
		f.limits.memLimit = 0
	} else if f.memLimit != "auto" {
		if f.limits.memLimit, err = parseSize(f.memLimit); err != nil || f.limits.memLimit < 16<<20 {
			return 0, backend, fmt.Errorf("%w: --mem-limit %s: want auto, off or a size of at least 16M", errUsage, f.memLimit)
		}
	}
	if f.maxRegions < 1 || f.maxRegions > 4096 {
		return 0, backend, fmt.Errorf("%w: --max-regions %d: want 1..4096", errUsage, f.maxRegions)
	}
	if f.portDepth < 1 {
		return 0, backend, fmt.Errorf("%w: --port-depth %d: want at least 1", errUsage, f.portDepth)
	}
	if f.timeout < MinTimeout {
		return 0, backend, fmt.Errorf("%w: --timeout %v: want at least %v", errUsage, f.timeout, MinTimeout)
	}
	if f.dcis < 0 {
		return 0, backend, fmt.Errorf("%w: --dcis %d: want 0 (the default) or more", errUsage, f.dcis)
	}
	if f.rcCap < 0 {
		return 0, backend, fmt.Errorf("%w: --rc-cap %d: want 0 (the default) or more", errUsage, f.rcCap)
	}
	if f.gid > 1<<24 {
		return 0, backend, fmt.Errorf("%w: --gid %d: want 1..%d", errUsage, f.gid, 1<<24)
	}
	if f.encrypt && f.keyFile == "" {
		return 0, backend, fmt.Errorf("%w: --encrypt needs --cluster-key-file", errUsage)
	}
	backend, err = nic.ParseBackend(f.backend)
	if err != nil {
		return 0, backend, fmt.Errorf("%w: --backend: %v", errUsage, err)
	}
	if !slices.Contains(fs.Transports, f.transport) {
		return 0, backend, fmt.Errorf("%w: --fuse-transport %q: want one of %s", errUsage, f.transport, strings.Join(fs.Transports, ", "))
	}
	if f.ringBatch < 1 || f.ringBatch > fuseserve.MaxEntriesPerQueue {
		return 0, backend, fmt.Errorf("%w: --fuse-ring-batch %d: want 1 to %d", errUsage, f.ringBatch, fuseserve.MaxEntriesPerQueue)
	}
	if f.transport == fs.TransportURing {
		if ok, why := fuseserve.KernelOffersURing(); !ok {
			return 0, backend, fmt.Errorf("--fuse-transport uring: %s", why)
		}
	}
	if f.listen != "" {
		if ap, err := netip.ParseAddrPort(f.listen); err != nil || ap.Addr().IsUnspecified() {
			return 0, backend, fmt.Errorf("%w: --listen %q: want a specific IP:PORT that peers can reach", errUsage, f.listen)
		}
	}
	if err := shm.CheckFits(storeDir(f.shmDir, uint32(f.gid)), mem); err != nil {
		return 0, backend, fmt.Errorf("--mem-size %s: %w", f.memSize, err)
	}
	return mem, backend, nil
}

// servingMessage is the log line of a mounted daemon.
func servingMessage(daemon bool) string {
	if daemon {
		return "krfs mounted; serving in the background until unmounted"
	}
	return "krfs mounted; serving in the foreground until unmounted or interrupted"
}

package node

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/internal/fusetest"
	"github.com/krfs/krfs/internal/leaktest"
)

// fileAtomic runs an atomic ioctl on f and returns the word's old value.
func fileAtomic(f *os.File, cmd uint32, arg fs.AtomicArg) (uint64, error) {
	var b [fs.AtomicArgSize]byte
	arg.Encode(b[:])
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(cmd), uintptr(unsafe.Pointer(&b[0]))); e != 0 {
		return 0, e
	}
	var out fs.AtomicArg
	if err := out.Decode(b[:]); err != nil {
		return 0, err
	}
	return out.Old, nil
}

// An atomic through a descriptor that still holds the peer's old key for
// "mem" (the peer resized it: a new registration, a new rkey) is refused
// by the peer, did not act, and is retried once with the new key by the
// filesystem's stale-region rule: the caller sees it succeed, exactly once.
func TestAtomicAfterPeerResize(t *testing.T) {
	fusetest.Require(t)
	leaktest.Check(t)
	a := testNode(t)
	b, err := startAt(t, Config{Meta: []netip.AddrPort{a.Device().Addr()}, ShmDir: t.TempDir(), MemSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dir := mountNode(t, a)
	f, err := os.OpenFile(filepath.Join(dir, "peers", fmt.Sprint(b.Self()), "mem"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if old, err := fileAtomic(f, fs.IoctlFetchAdd, fs.AtomicArg{A: 1}); err != nil || old != 0 {
		t.Fatalf("first FetchAdd: %d, %v", old, err)
	}
	if _, err := b.Export("mem", 8192, 0o666, 0, 0); err != nil {
		t.Fatal(err)
	}
	if old, err := fileAtomic(f, fs.IoctlFetchAdd, fs.AtomicArg{A: 1}); err != nil || old != 1 {
		t.Fatalf("FetchAdd after the peer resized mem: %d, %v; want 1, nil", old, err)
	}
	if old, err := fileAtomic(f, fs.IoctlCompareAndSwap, fs.AtomicArg{A: 2, B: 7}); err != nil || old != 2 {
		t.Fatalf("CompareAndSwap: %d, %v; want 2 (the FetchAdd acted once)", old, err)
	}
}

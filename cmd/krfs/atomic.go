package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"unsafe"

	"github.com/krfs/krfs/fs"
	"golang.org/x/sys/unix"
)

// runAtomic is `krfs atomic faa FILE OFFSET DELTA` and `krfs atomic cas
// FILE OFFSET COMPARE SWAP`: one atomic on an 8-byte word of a region
// file through the krfs ioctl; prints the old value in decimal.
func runAtomic(args []string, stdout, stderr io.Writer) error {
	if len(args) < 1 {
		return fmt.Errorf("%w: atomic faa FILE OFFSET DELTA | atomic cas FILE OFFSET COMPARE SWAP", errUsage)
	}
	var cmd uint32
	var want int
	switch args[0] {
	case "faa":
		cmd, want = fs.IoctlFetchAdd, 4
	case "cas":
		cmd, want = fs.IoctlCompareAndSwap, 5
	default:
		return fmt.Errorf("%w: unknown atomic %q (faa or cas)", errUsage, args[0])
	}
	if len(args) != want {
		return fmt.Errorf("%w: atomic %s takes %d arguments", errUsage, args[0], want-1)
	}
	nums := make([]uint64, len(args)-2)
	for i, a := range args[2:] {
		v, err := strconv.ParseUint(a, 0, 64)
		if err != nil {
			// Allow negative deltas for faa (two's complement).
			sv, serr := strconv.ParseInt(a, 0, 64)
			if serr != nil {
				return fmt.Errorf("%w: %q is not a number", errUsage, a)
			}
			v = uint64(sv)
		}
		nums[i] = v
	}
	if nums[0]%8 != 0 {
		return fmt.Errorf("%w: offset %d is not 8-byte aligned", errUsage, nums[0])
	}
	arg := fs.AtomicArg{Offset: nums[0], A: nums[1]}
	if len(nums) == 3 {
		arg.B = nums[2]
	}
	f, err := os.OpenFile(args[1], os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var b [fs.AtomicArgSize]byte
	arg.Encode(b[:])
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(cmd), uintptr(unsafe.Pointer(&b[0]))); e != 0 {
		if e == unix.ENOTTY {
			return fmt.Errorf("%s: not a krfs region file", args[1])
		}
		return fmt.Errorf("%s: %w", args[1], e)
	}
	if err := arg.Decode(b[:]); err != nil {
		return err
	}
	fmt.Fprintln(stdout, arg.Old)
	return nil
}

package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"unsafe"

	"github.com/spf13/cobra"

	"github.com/krfs/krfs/fs"
	"golang.org/x/sys/unix"
)

func atomicCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "atomic faa|cas FILE OFFSET ...",
		Short: "One RDMA atomic on an 8-byte word of a region file; prints the old value",
		Long: `One RDMA atomic on the 8-byte word at OFFSET (a multiple of 8) of a region
file, through the krfs ioctl; prints the word's old value in decimal.
Numbers are decimal, 0x hex or 0 octal; a negative DELTA adds its two's
complement.

Exit status: 0 done (cas: swapped), 1 cas did not swap (the old value is
still printed) or the atomic failed, 2 bad usage.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return fmt.Errorf("%w: want faa or cas", errUsage)
		},
	}
	faa := &cobra.Command{
		Use:     "faa FILE OFFSET DELTA",
		Short:   "Fetch and add: add DELTA to the word at OFFSET, print the old value",
		Example: "  krfs atomic faa /mnt/krfs/peers/$(ls /mnt/krfs/peers | head -1)/mem 64 1",
		Args:    exactArgs(3, "FILE OFFSET DELTA"),
		RunE: func(_ *cobra.Command, args []string) error {
			return runAtomic(fs.IoctlFetchAdd, args, stdout)
		},
	}
	cas := &cobra.Command{
		Use:     "cas FILE OFFSET COMPARE SWAP",
		Short:   "Compare and swap: if the word at OFFSET is COMPARE, make it SWAP; print the old value (exit 1 if not swapped)",
		Example: "  krfs atomic cas /mnt/krfs/peers/$(ls /mnt/krfs/peers | head -1)/mem 64 0 7",
		Args:    exactArgs(4, "FILE OFFSET COMPARE SWAP"),
		RunE: func(_ *cobra.Command, args []string) error {
			return runAtomic(fs.IoctlCompareAndSwap, args, stdout)
		},
	}
	for _, c := range []*cobra.Command{faa, cas} {
		c.Flags().SetInterspersed(false) // a negative DELTA is not a flag
	}
	cmd.AddCommand(faa, cas)
	return cmd
}

// runAtomic runs one atomic ioctl (cmd) with args FILE OFFSET A [B].
func runAtomic(cmd uint32, args []string, stdout io.Writer) error {
	nums := make([]uint64, len(args)-1)
	for i, a := range args[1:] {
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
	f, err := os.OpenFile(args[0], os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var b [fs.AtomicArgSize]byte
	arg.Encode(b[:])
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(cmd), uintptr(unsafe.Pointer(&b[0]))); e != 0 {
		switch e {
		case unix.ENOTTY:
			return fmt.Errorf("%s: not a krfs region file", args[0])
		case unix.ETIMEDOUT:
			return fmt.Errorf("%s: outcome unknown: the atomic was sent and may have executed (no answer in time); check the word before retrying: %w", args[0], e)
		case unix.EINVAL:
			if st, serr := f.Stat(); serr == nil && arg.Offset+8 > uint64(st.Size()) {
				return fmt.Errorf("%s: offset %d is past the end: the region is %d bytes (the last word is at %d)",
					args[0], arg.Offset, st.Size(), max(st.Size()-8, 0)&^7)
			}
		}
		return fmt.Errorf("%s: %w", args[0], e)
	}
	if err := arg.Decode(b[:]); err != nil {
		return err
	}
	fmt.Fprintln(stdout, arg.Old)
	if cmd == fs.IoctlCompareAndSwap && arg.Old != nums[1] {
		return fmt.Errorf("%w: the word at %d holds %d, not %d", errNotSwapped, arg.Offset, arg.Old, nums[1])
	}
	return nil
}

package verbs

import (
	"os"
	"unsafe"
)

// PageSize is the granule of memory registration: the kernel's page size.
var PageSize = os.Getpagesize()

// PageOffset is buf's offset in its page: the IOVA RegMR registers it at
// (see MR.IOVA). The kernel refuses an MR whose IOVA and address differ
// within the page (ib_uverbs_reg_mr: EINVAL), so a buffer can be
// zero-based (IOVA 0) only if it starts on a page boundary.
func PageOffset(buf []byte) uint64 {
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))) % uintptr(PageSize))
}

// PageAligned returns n zeroed bytes that start on a page boundary, so
// that their MR is zero-based: peers address it by offsets alone. Memory
// published by rkey alone (a region, a table) is allocated so.
func PageAligned(n int) []byte {
	if n <= 0 {
		return nil
	}
	b := make([]byte, n+PageSize-1)
	off := (PageSize - int(PageOffset(b))) % PageSize
	return b[off : off+n : off+n]
}

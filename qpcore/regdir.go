package qpcore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/krfs/krfs/verbs"
)

// The region directory is a registered block of memory, remotely
// READable, that lists the regions a node exports. Its rkey and length are
// published in meta.NodeInfo (DirRKey, DirLen), so a peer learns every
// region's rkey, length and access with one READ. All integers are little
// endian.
//
//	header, 64 bytes:
//	  0  magic    u32  "KRD1"
//	  4  recLen   u16  80
//	  6  format   u16  1
//	  8  capacity u32  number of records
//	 12  reserved u32
//	 16  incarnation u64  of the exporting node
//	 24  generation  u64  bumped on every change
//	 32  reserved [32]
//	record i at 64 + 80*i:
//	  0  seqHead u32   seqlock, even when stable
//	  4  rkey    u32
//	  8  length  u64
//	 16  access  u8    verbs.Access
//	 17  flags   u8    bit 0: in use
//	 18  nameLen u8
//	 19  reserved u8
//	 20  mode    u32   permission bits (reserved for the filesystem)
//	 24  uid     u32   owner (reserved)
//	 28  gid     u32
//	 32  name    [32]
//	 64  reserved [12]
//	 76  seqTail u32
//
// A writer (one at a time, under the directory's lock) changes record i
// with seqTail = s+1, then the body, then seqHead = s+2, then seqTail =
// s+2. A READ copies memory from low to high addresses, so it takes
// seqHead before the body and seqTail after; a record is consistent iff
// seqHead == seqTail and both are even. A reader that sees a torn record
// reads again: at once a few times, then backing off, for up to
// PeerTimeout (a writer can be descheduled in the middle of an update).
const (
	dirMagic      = 0x3144524b // "KRD1"
	dirFormat     = 1
	dirHeaderLen  = 64
	dirRecordLen  = 80
	maxDirRecords = 4096
	// MaxRegionName is the longest region name.
	MaxRegionName = 32

	recFlagInUse = 1
)

// DirLen is the directory size for a capacity of n records.
func DirLen(n int) int { return dirHeaderLen + n*dirRecordLen }

// Region describes an exported memory region, as listed in a directory.
type Region struct {
	Name   string
	RKey   uint32
	Len    uint64
	Access verbs.Access
	// Mode, UID and GID are owner and permission bits kept for the
	// filesystem layer; qpcore does not interpret them.
	Mode, UID, GID uint32
	// Version is the record's seqlock value: it changes whenever the
	// record does.
	Version uint32
}

// exported is a region of this node.
type exported struct {
	Region
	slot int
	mr   verbs.MR
}

// regionDir is the exporting side: the directory memory and the regions
// behind it.
type regionDir struct {
	pd   verbs.PD
	sync func() // device memory barrier after a change (may be nil)

	rkey uint32 // the directory's rkey, kept after close for Node.Info

	mu     sync.Mutex // guards everything below and all writes to buf
	buf    []byte
	mr     verbs.MR
	byName map[string]*exported
	slots  []*exported // nil: free record
	gen    uint64
}

func newRegionDir(pd verbs.PD, capacity int, incarnation uint64, sync func()) (*regionDir, error) {
	// Page-aligned: peers READ the directory at offsets, so its MR must
	// be zero-based (verbs.MR.IOVA).
	d := &regionDir{pd: pd, sync: sync, buf: verbs.PageAligned(DirLen(capacity)),
		byName: make(map[string]*exported), slots: make([]*exported, capacity)}
	binary.LittleEndian.PutUint32(d.buf[0:], dirMagic)
	binary.LittleEndian.PutUint16(d.buf[4:], dirRecordLen)
	binary.LittleEndian.PutUint16(d.buf[6:], dirFormat)
	binary.LittleEndian.PutUint32(d.buf[8:], uint32(capacity))
	binary.LittleEndian.PutUint64(d.buf[16:], incarnation)
	mr, err := pd.RegMR(d.buf, verbs.AccessRemoteRead)
	if err != nil {
		return nil, fmt.Errorf("qpcore: registering the region directory: %w", err)
	}
	d.mr, d.rkey = mr, mr.RKey()
	return d, nil
}

func validName(name string) bool {
	return len(name) > 0 && len(name) <= MaxRegionName && !strings.ContainsAny(name, "/\x00")
}

func (d *regionDir) export(name string, buf []byte, access verbs.Access, mode, uid, gid uint32) (Region, error) {
	if !validName(name) {
		return Region{}, ErrBadName
	}
	if len(buf) == 0 {
		return Region{}, ErrLocalLength
	}
	if verbs.PageOffset(buf) != 0 {
		return Region{}, fmt.Errorf("%w: %q starts %d bytes into a page", ErrUnaligned, name, verbs.PageOffset(buf))
	}
	access &= verbs.AccessAll
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 {
		access |= verbs.AccessLocalWrite
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mr == nil {
		return Region{}, ErrClosed
	}
	if _, dup := d.byName[name]; dup {
		return Region{}, fmt.Errorf("%w: %q", ErrExists, name)
	}
	slot := -1
	for i, s := range d.slots {
		if s == nil {
			slot = i
			break
		}
	}
	if slot < 0 {
		return Region{}, ErrNoSpace
	}
	mr, err := d.pd.RegMR(buf, access)
	if err != nil {
		return Region{}, fmt.Errorf("qpcore: registering region %q: %w", name, err)
	}
	e := &exported{Region: Region{Name: name, RKey: mr.RKey(), Len: uint64(len(buf)), Access: access,
		Mode: mode, UID: uid, GID: gid}, slot: slot, mr: mr}
	e.Version = d.writeLocked(slot, &e.Region, true)
	d.slots[slot] = e
	d.byName[name] = e
	return e.Region, nil
}

func (d *regionDir) setOwner(name string, mode, uid, gid uint32) (Region, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.byName[name]
	if e == nil {
		return Region{}, fmt.Errorf("%w: %q", ErrNotPresent, name)
	}
	e.Mode, e.UID, e.GID = mode, uid, gid
	e.Version = d.writeLocked(e.slot, &e.Region, true)
	return e.Region, nil
}

// unexport removes name from the directory, then deregisters its MR, so
// that a peer holding the old rkey gets a remote access error.
func (d *regionDir) unexport(name string) error {
	d.mu.Lock()
	e := d.byName[name]
	if e == nil {
		d.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrNotPresent, name)
	}
	d.writeLocked(e.slot, &Region{}, false)
	d.slots[e.slot] = nil
	delete(d.byName, name)
	d.mu.Unlock()
	return e.mr.Dereg()
}

func (d *regionDir) list() []Region {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Region, 0, len(d.byName))
	for _, e := range d.byName {
		out = append(out, e.Region)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (d *regionDir) lookup(name string) (exported, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.byName[name]
	if e == nil {
		return exported{}, false
	}
	return *e, true
}

// close deregisters the directory and every region.
func (d *regionDir) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for _, e := range d.byName {
		errs = append(errs, e.mr.Dereg())
	}
	clear(d.byName)
	clear(d.slots)
	if d.mr != nil {
		errs = append(errs, d.mr.Dereg())
		d.mr = nil
	}
	return errors.Join(errs...)
}

// writeLocked rewrites record slot under the seqlock protocol and returns
// the new version.
func (d *regionDir) writeLocked(slot int, r *Region, inUse bool) uint32 {
	rec := d.buf[dirHeaderLen+slot*dirRecordLen:][:dirRecordLen]
	s := binary.LittleEndian.Uint32(rec[0:])
	storeLE32(rec[76:], s+1)
	body := rec[4:76]
	clear(body)
	if inUse {
		binary.LittleEndian.PutUint32(rec[4:], r.RKey)
		binary.LittleEndian.PutUint64(rec[8:], r.Len)
		rec[16] = byte(r.Access)
		rec[17] = recFlagInUse
		rec[18] = byte(len(r.Name))
		binary.LittleEndian.PutUint32(rec[20:], r.Mode)
		binary.LittleEndian.PutUint32(rec[24:], r.UID)
		binary.LittleEndian.PutUint32(rec[28:], r.GID)
		copy(rec[32:64], r.Name)
	}
	storeLE32(rec[0:], s+2)
	storeLE32(rec[76:], s+2)
	d.gen++
	storeLE64(d.buf[24:], d.gen)
	if d.sync != nil {
		d.sync()
	}
	return s + 2
}

// storeLE32 stores v little endian into b[:4] with one atomic store, so
// that the store is not reordered with the body writes around it.
func storeLE32(b []byte, v uint32) {
	var x [4]byte
	binary.LittleEndian.PutUint32(x[:], v)
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[0])), binary.NativeEndian.Uint32(x[:]))
}

func storeLE64(b []byte, v uint64) {
	var x [8]byte
	binary.LittleEndian.PutUint64(x[:], v)
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&b[0])), binary.NativeEndian.Uint64(x[:]))
}

// errTorn reports a record caught in the middle of an update.
var errTorn = errors.New("qpcore: torn directory record")

// parseDirectory decodes a directory READ from a peer. It returns errTorn
// if any record was being written during the READ.
func parseDirectory(b []byte) (map[string]Region, uint64, error) {
	if len(b) < dirHeaderLen {
		return nil, 0, fmt.Errorf("%w: %d bytes", ErrDirectory, len(b))
	}
	if binary.LittleEndian.Uint32(b[0:]) != dirMagic || binary.LittleEndian.Uint16(b[4:]) != dirRecordLen ||
		binary.LittleEndian.Uint16(b[6:]) != dirFormat {
		return nil, 0, fmt.Errorf("%w: bad header", ErrDirectory)
	}
	n := int(binary.LittleEndian.Uint32(b[8:]))
	if n > maxDirRecords || DirLen(n) > len(b) {
		return nil, 0, fmt.Errorf("%w: %d records in %d bytes", ErrDirectory, n, len(b))
	}
	inc := binary.LittleEndian.Uint64(b[16:])
	out := make(map[string]Region)
	for i := range n {
		rec := b[dirHeaderLen+i*dirRecordLen:][:dirRecordLen]
		head, tail := binary.LittleEndian.Uint32(rec[0:]), binary.LittleEndian.Uint32(rec[76:])
		if head != tail || head&1 != 0 {
			return nil, inc, errTorn
		}
		if rec[17]&recFlagInUse == 0 {
			continue
		}
		nl := int(rec[18])
		if nl == 0 || nl > MaxRegionName {
			return nil, inc, fmt.Errorf("%w: record %d name length %d", ErrDirectory, i, nl)
		}
		r := Region{Name: string(rec[32 : 32+nl]), RKey: binary.LittleEndian.Uint32(rec[4:]),
			Len: binary.LittleEndian.Uint64(rec[8:]), Access: verbs.Access(rec[16]),
			Mode: binary.LittleEndian.Uint32(rec[20:]), UID: binary.LittleEndian.Uint32(rec[24:]),
			GID: binary.LittleEndian.Uint32(rec[28:]), Version: head}
		out[r.Name] = r
	}
	return out, inc, nil
}

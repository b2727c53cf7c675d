// Package fs is the krfs FUSE filesystem: remote memory through plain
// file I/O, for programs in any language and for shell scripts.
//
// # The tree
//
//	MOUNT/
//	  peers/                  one directory per live node in the meta service
//	    <gid>/
//	      mem                 the peer's default region
//	      mr/<name>           each region the peer exports; st_size = region size
//	      ports/<port>        each write() sends one message (at most MaxMessage
//	                          bytes) to that port on the peer; returns once queued
//	      info                text: address, incarnation, transport in use, counters
//	  regions/<name>          regions this node exports, files of their size: create
//	                          exports, truncate or a write past the end resizes,
//	                          rm unexports; regions/mem is the default region
//	  ports/<port>            this node's receive ports: create binds, each read()
//	                          returns exactly one message, rm unbinds
//	  stats, stats.json       pool, cache, switches, NIC counters
//
// Opening a peer file gives the open file its own virtual QP (Backend.
// Connect); pread and pwrite are one-sided READs and WRITEs at that offset.
// Concurrent preads of one file are served concurrently (go-fuse runs
// requests in parallel) and batched by qpcore: operations that arrive while
// others of the peer are in flight leave together with one doorbell.
// Files are direct_io, so every read reaches the peer.
//
// # Byte counts
//
// A read at or past the end returns 0 and a read across it is short. A
// write across the end writes every byte in range and reports that count;
// the next write, at the end, fails with EFBIG. A FUSE read request that
// fails returns an error, never part of its bytes. A write that fails
// reports the prefix known to have landed, or the error if none did. The
// kernel splits a transfer into FUSE requests of at most MaxIO bytes
// (fewer when the caller's buffer is not page-aligned) and, when a later
// request fails, returns the bytes of the requests before it: exactly the
// prefix that was transferred; the next call at the following offset
// returns the error. So a short read means the end of the region unless
// the call spanned more than one request (more than MaxIO bytes, or more
// than 256 pages of the caller's buffer).
//
// Times: a local region's mtime and ctime move on writes, resizes and
// atomics through the mount, and utimensat sets them; a peer's region
// shows its last write through this node (utimensat: EPERM); see
// fileTimes. statfs reports the region store's capacity (a
// CapacityReporter backend) and the regions' sizes as used.
//
// fsync and fdatasync succeed on every file and directory: a write is
// complete when write() returns. mmap MAP_SHARED fails with ENODEV (the
// kernel's answer for a direct_io file; the daemon never sees the call);
// MAP_PRIVATE is the kernel's to allow, and reads each page from the
// region when it is first touched.
//
// Errors come back as errno: EIO for a remote failure, ETIMEDOUT for an
// operation that did not complete within Options.Timeout's bound (for an
// atomic: it was sent and its outcome is unknown; it may have executed,
// and every other errno of an atomic means it did not run), EHOSTDOWN for a
// peer declared down on evidence of death (see qpcore's "Timeouts and
// liveness") or an unreachable meta service, EPROTO for a peer on another
// transport (softnic and rdma nodes cannot reach each other), ENOENT for
// an unknown gid, region or port, ESTALE for a peer that changed again
// while an operation refused by its restart was retried (see "Peers
// change"), EACCES for a permission, EINVAL for bad alignment or arguments, EROFS for any change to the
// entries of peers/ (or the root), which mirror the cluster. Every remote
// operation ends within qpcore's PeerTimeout (krfs's --timeout) plus a
// housekeeping tick; Options.Timeout, which krfs sets to --timeout + 1 s,
// is only a backstop. Reads, writes, atomics and port writes share one
// backstop context per 100 ms window instead of a timer each, so theirs
// may come up to 100 ms later.
//
// # Peers change
//
// peers/<gid>/mr/ follows the peer: a listing reads the peer's region
// directory again, a lookup or stat uses a copy at most 1 s old (a name
// it lacks is looked up in the directory read again, and a name the peer
// does not have is an ENOENT the kernel does not cache: a region created
// on the peer is found at once), and an open takes the size from such a
// copy. An open descriptor follows the region: a
// read or write at or past the end as last seen reads the directory
// again (a grown region's new bytes are read; at the new end a read
// returns 0), and an operation (read, write or atomic) that fails because
// the region changed (a new rkey, a new size, removed: a peer that
// restarted) reads the directory again and is retried once, by one rule
// for every region (retryStale). A removed region is ENOENT; once it is back under the same name,
// the same descriptor works again.
//
// peers/<gid>/mem of a peer just looked up is described by the peer's
// meta entry (size, mode, owner: a hint, see qpcore's "default region"),
// so its LOOKUP, stat and open cost no directory READ: a cold peer is the
// meta lookup plus the data. An open of mem takes the size from whatever
// qpcore holds for it, of any age (a stale size comes with a stale rkey,
// which the peer refuses: the read or write looks again and is retried). Its mode and owner are then at most the meta
// client's DCCache TTL (30 s by default) plus 1 s old; a peer whose entry
// carries no owner is stat'ed from its directory as above. The names that
// cannot change meaning (the root's children; mem, mr, ports and info
// under a peer) are given to the kernel for an hour (attributes: 1 s).
// peers/<gid> of a node the meta service lists is given for 10 s.
//
// peers/<gid> of a node the meta service no longer has is ENOENT once
// the kernel's 1 s entry is due and the meta client's cached entry is gone
// (dropped by a listing that lacks the node, else its TTL), though this
// node still holds the peer's metadata (Backend.PeerInfo decides).
//
// With the meta service unreachable, ls peers shows the last list it
// gave, and peers this node knows (their metadata is cached) keep
// working; only unknown peers fail, with EHOSTDOWN, within the mount's
// timeout.
//
// # Local regions
//
// regions/<name> is a file of the region's size. Create makes an empty
// region, listed at once; O_TRUNC and truncate resize it; a write past
// the end grows it, as do fallocate (mode 0) and O_APPEND (a resize
// registers it again: peers see the new size and rkey), up to
// Options.MaxRegionSize, beyond which a write or truncate fails with
// EFBIG. The default region mem and peers' regions keep their size: a
// truncation to 0 (O_TRUNC) is ignored, another resize is EPERM, O_APPEND
// is EINVAL, fallocate past the end EFBIG. fallocate modes other than 0
// are EOPNOTSUPP; link, symlink, mknod and mkdir in regions/ are EPERM.
// The backend refuses a region past its count limit (ENOSPC) or with a bad
// name (EINVAL: 1-32 characters of [A-Za-z0-9._-]); the refusal is logged
// through Options.Logf and leaves nothing behind (a region created empty
// by the descriptor whose resize was refused is removed again).
//
// # Ports
//
// ports/<port> belongs to the user that bound it, mode 0600 (chmod and
// chown as on regions); peers/<gid>/ports/<port> has the owner and the
// write bits of peers/<gid>/mem, so sending follows the rule for writing
// the peer's memory. stats.json leaves rkeys out for callers other than
// root.
//
// Each port queues a bounded number of messages (the backend's depth); a
// write to a full port retries until the mount's timeout and then fails
// with EAGAIN, without holding up other ports; a write to an unbound port
// fails with ENOENT. A read returns the next message, waiting for one,
// except on a descriptor whose last read returned a message: there an
// empty queue reads as an end of file (0), and the read after it waits
// again; on a descriptor opened O_NONBLOCK an empty queue is EAGAIN.
// A large message nobody reads yet is staged by the receiving daemon,
// so the write returns without waiting for a reader. A message taken for
// a read whose caller was interrupted (a signal, a kill) before the reply
// left goes back to the head of the queue (StreamPort), so a reader that
// gives up loses nothing; a reply the kernel refuses (the mount is gone)
// is not reported to the tree by either transport.
// poll, select and epoll wait for a message with Options.Poll on a mount
// that krfs's own server serves (TransportURing; TransportAuto when the
// kernel offers io_uring; see portPolls); go-fuse's server (TransportDev)
// answers FUSE_POLL with ENOSYS, and the kernel then reports every file
// always ready.
// A port is a regular file that cannot seek, not a FIFO: the kernel
// serves FIFO inodes of a FUSE mount as local pipes. Its st_size is the
// bytes queued plus the bytes read through its open descriptors, never
// cached by the kernel: it grows by each message, so tail -f (which on
// FUSE polls fstat and reads what the size grew by) prints each message
// as it arrives, after reading the queue to its end of file.
// Tree walkers must skip ports/ (a read waits for, and consumes, a
// message); ports/ lists only bound ports and peers/<gid>/ports/ lists
// nothing, so a walk of a node that bound no port meets none.
//
// # Atomics
//
// IoctlFetchAdd and IoctlCompareAndSwap on any region file act on an
// 8-byte aligned word and return its old value (AtomicArg). They are
// restricted ioctls, which FUSE carries without help from the caller;
// `krfs atomic faa|cas` is the shell form. An atomic writes, so like
// write(2) it needs a descriptor opened for writing (O_WRONLY or O_RDWR):
// through an O_RDONLY descriptor it fails with EBADF, on peer files and
// on regions/ alike. Who may open a file for writing is the kernel's
// decision from the file's mode and owner (with default_permissions).
//
// # Zero copy
//
// A READ's response lands in a block of the mount's I/O buffers
// (IOBuffers: a slab the backend registered once, when it is a
// BufferRegistrar), and go-fuse writes the reply from that block; with no
// free block it lands in the buffer go-fuse replies from (the dest slice
// of Read), counted in IOBufferStats.Overflows. A WRITE is sent from the
// FUSE request buffer. The only copies of payload bytes are the kernel's.
//
// # Memory
//
// The I/O buffers are the filesystem's only memory for payload, and they
// never grow (Options.IOBufferBytes, 8 MiB by default). go-fuse still
// allocates a reply buffer per READ, which this package does not use;
// collecting that garbage is the Go runtime's job (krfs mount sets a soft
// memory limit, --mem-limit).
//
// # The seam
//
// The filesystem knows nothing of QPs: it calls a Backend (the daemon's
// adapter over qpcore and the meta client). Tests mount it over an
// in-memory fake.
package fs

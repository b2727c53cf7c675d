// Package fuseserve is krfs's FUSE transport: it mounts /dev/fuse itself
// and serves a go-fuse RawFileSystem over FUSE over io_uring (Linux 6.14
// and later, with the fuse module's enable_uring set), or over the
// classic /dev/fuse loop.
//
// Mount makes the mount(2) call and answers INIT, echoing
// FUSE_OVER_IO_URING when the kernel offers it (Options.Mode: Auto, Uring
// or Dev). Over io_uring every possible CPU gets a queue of ring entries
// (Options.RingBytes sizes them: each has a payload buffer of the largest
// request), served by threads locked to their OS thread and pinned to
// that CPU, Options.EntriesPerThread entries each. A thread decodes a
// request, calls the RawFileSystem and commits the reply with the fetch
// of its next request, so a request never changes thread. The /dev/fuse
// loop stays for what the kernel still sends there: FORGET, INTERRUPT,
// requests before every queue is registered.
//
// Requests that may wait for good (reads and writes of a non-seekable
// file, such as a krfs port) run on a goroutine; the thread commits their
// reply when an eventfd read in its ring completes. A READ whose result is
// a PendingRead (its data still on the wire) is answered once Ready: a
// thread with several entries serves the others meanwhile and, with
// nothing else to do, waits for its oldest READ in slices of a
// millisecond, so that a slow READ holds up what arrives after it no
// longer than that. Any other handler that blocks holds up the entries of
// its thread: with one entry per thread (the default) nothing else.
//
// Options.ReplyMemory hands the entries' payload buffers to the file
// system before the first request, so that a READ's data can land there
// (registered with a NIC) and the kernel's copy to the caller is the only
// one; Stats counts the replies that had to be copied. Notifications
// (entry and inode invalidations, poll wake-ups) go to /dev/fuse through
// a Notifier. Unmount, or the daemon's death, completes every entry with
// ENOTCONN; a stall watch (fusectl's waiting) logs and counts a mount
// whose requests stopped being served.
package fuseserve

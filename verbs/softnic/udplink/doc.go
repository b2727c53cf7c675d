// Package udplink is the real-UDP implementation of link.Link: one UDP
// socket per softnic device, driven by raw Linux system calls so that the
// kernel's socket copy is the only copy a payload ever sees.
//
// # Opening a link
//
//	l, err := udplink.Open(udplink.DefaultConfig("127.0.0.1:0"))
//	...
//	l.Start(receiver) // begins delivery on the link's receive goroutine
//	defer l.Close()
//
// Addresses are numeric ("192.0.2.1:4791", "[2001:db8::1]:0"); port 0 picks
// a free port, LocalAddr reports it. An IPv6 link bound to "[::]" is dual
// stack: it reaches IPv4 peers too, and reports their addresses unmapped
// (as plain IPv4). DefaultConfig turns GSO and GRO on and sizes the socket
// buffers to 8 MiB; the zero Config turns both offloads off.
//
// # Receiving: one recvmsg per datagram, payload predicted in place
//
// One goroutine at a time receives: the holder of the receive token (see
// "Run to completion"), which is the link's own goroutine, started by
// Start, while nobody drives. It blocks in recvmsg on a blocking socket
// (not in Go's netpoller, whose cross-CPU wake-ups cost more than the rest
// of a round trip on a small machine).
//
// A Receiver that implements link.Predictor (softnic's Device does) gets
// ONE recvmsg per datagram, with no peek. Before each receive the link
// takes RxLock and asks Predict where the next packets' payloads belong
// (softnic: the next bytes of the oldest READ in progress into a private
// buffer), then receives with an iovec that scatters each
// predicted payload straight into that memory and everything else into
// the 64 KiB scratch buffer, laid out like the datagram; it keeps RxLock
// while blocked. After the receive it calls Steer for every packet as
// below; a packet whose payload landed in predicted memory that Steer
// names for it, behind a header of the predicted length, is delivered in
// place (Counters.RxSteered). Payload bytes that landed in predicted
// memory they do not belong to (reordering, loss, duplicates, another
// QP's packet, a different header length) are copied back into scratch
// before anything is delivered and counted, one per packet, in
// Counters.RxMispredicted; the receiver then places them (the engine
// counts its own copy). Predicted memory that received the wrong bytes
// holds them until the right packet arrives, which is why predictions,
// like Steer, may name only memory that is not yet valid and that nobody
// else can see before the transfer completes (see link.Predictor).
//
// Holding RxLock while blocked needs two hand-shakes:
//   - Anything else that takes the receiver's lock (an error flush, MR
//     deregistration, a retransmission timer) first publishes the wish,
//     so that Predict returns 0, then calls InterruptRecv (Predict's
//     link.Interrupter), which kicks the blocked receiver with an empty
//     datagram when it waits holding the lock. The receiver publishes
//     that it will block before it calls Predict, so one side always sees
//     the other. A kick can be lost (an input firewall drops it), so a
//     blocking receive that holds RxLock returns after at most 20 ms
//     (SO_RCVTIMEO, counted in Counters.RxTimeouts) and then allows a new
//     kick. The timeout is set when a receiver blocks holding RxLock and
//     cleared once a wait without RxLock has timed out (the link was idle
//     for 20 ms): an idle link wakes once, then sleeps until a datagram
//     comes, and a busy one does not toggle it per READ.
//   - With nothing predicted the receiver waits without RxLock. A READ
//     request of at least predictKickMin (64 KiB) sent while it waits so
//     kicks it first, so that it predicts the response's destination; a
//     smaller response lands in scratch and is copied by the engine
//     (counted in its Misplaced), which costs less than the extra wake-up.
//
// A Receiver without Predict gets the peek path; per datagram the link
//
//  1. peeks (MSG_PEEK|MSG_TRUNC) the first wire.MaxHeaderLen bytes, the
//     source address, the datagram's total length and, with GRO, the
//     UDP_GRO control message carrying the segment size;
//  2. takes the Receiver's RxLock and, if the first header parses
//     (wire.HeaderLen), calls Steer for every packet of the datagram —
//     packet i of a GRO batch with the FIRST packet's header and index i,
//     its payload length computed from the segment size and the first
//     header's length;
//  3. receives the datagram for real with ONE recvmsg whose iovec scatters
//     each steered payload straight into the memory Steer returned and
//     everything else (headers, unsteered payloads) into a 64 KiB scratch
//     buffer laid out like the datagram;
//  4. checks each packet's real header length against the prediction and
//     calls Deliver, then RxUnlock.
//
// A packet whose real header length differs from the prediction (a GRO
// batch mixing, say, a first WRITE packet with RETH and middle packets
// without it) had part of its payload placed at the wrong offset: the
// link copies the steered bytes back behind the header in scratch, splits
// the packet correctly and delivers the scratch copy (counted in
// Counters.RxReassembled). The steered memory then holds wrong bytes until
// the right packet arrives, so receivers steer only into memory that is
// not yet valid and that nobody else can see (see link.Receiver).
//
// Malformed packets are delivered, not dropped, so that the receiver
// counts them: a packet whose base header does not parse, or whose header
// is longer than the packet, is passed to Deliver whole as hdr with a nil
// payload (an empty datagram as an empty hdr), and counted in
// Counters.RxMalformed. Steer is never called for a datagram whose first
// header does not parse.
//
// The hdr and payload slices given to Steer and Deliver are valid only
// during the call. Steer must return a slice of exactly the payload length
// or nil; any other length is treated as nil. Steer is called for
// header-only packets too (payload length 0; nothing to steer), but not
// for a last packet shorter than the predicted header, nor for packets
// past the 128th of a batch (more than the kernel ever coalesces). Steer and Deliver run on the
// receive goroutine; they may call Send but must not call Close.
//
// # Run to completion
//
// Link implements link.Driver: a caller waiting for a completion can
// receive on its own goroutine (Drive) instead of sleeping until the
// receive goroutine delivers it, which saves the thread wake-ups of a
// hand-off. The receive token decides who receives:
//
//   - Drive takes the token when it is free and then receives (blocking)
//     and delivers until its ready function reports true; on return it
//     hands the token to the oldest waiting Drive caller, or frees it.
//     A caller that finds the token taken waits on its own channel, its
//     wake channel, or its done channel, and checks ready again after
//     registering, so a condition made true meanwhile is never missed.
//   - The receive goroutine starts in blocking mode: it holds the token
//     and blocks in recvmsg, so a link nobody drives (a responder) costs
//     one receive call per datagram (two on the peek path). A driver that
//     finds it there kicks it out (below); it hands the token over and
//     switches to event mode: it waits, in Go's network poller, for an
//     edge-triggered epoll that holds the socket (the epoll does not take
//     the datagram), and receives (without blocking) only what arrives
//     while the token is free. Waiting in the poller rather than in
//     epoll_wait holds no P: with every P in a system call, the runtime
//     hands a blocked driver's P to another thread, and the driver pays a
//     thread switch when its recvmsg returns. After eight receives in a
//     row with no driver in between it goes back to blocking mode. The
//     socket is in the epoll set only in event mode: in blocking mode
//     every datagram would wake a poller thread for nothing. Out of the
//     set means removed (EPOLL_CTL_DEL): an entry left with no events
//     stays on the socket's wait queue, which every datagram sent or
//     received then walks with interrupts off (about 1.3 us per READ
//     round trip on loopback).
//   - While a driver holds the token (however it got it) the socket is out
//     of that epoll set, so a datagram the driver receives wakes no other
//     thread. When the last driver leaves, the socket stays out for a
//     while (lingering): a driver that comes back soon, like a
//     synchronous caller's next operation, takes the token with no system
//     call (Counters.EpollMoves counts the epoll_ctl calls; across a veth
//     the two per READ cost about 4 us of a 30 us round trip). The
//     receive goroutine's wait then has a deadline; when it passes and no
//     driver came for a whole period (lingerFor, 500 us), the goroutine
//     adds the socket back, which reports data already queued
//     (Counters.LingerRearms). A datagram that arrives while the socket
//     lingers is received by the next driver, or at the latest about
//     2 x lingerFor later; while drivers keep coming the goroutine wakes
//     once per period. Close ends a lingering wait at once. Three rules
//     keep lingering from delaying what someone waits for: a driver
//     lingers only while the Receiver reports itself quiet
//     (link.Quiescer: softnic has no send WR outstanding); StopLinger
//     (link.Lingerer), which softnic calls when a waiter that does not
//     drive asks for a CQ's notification, ends a linger; and a lapse that
//     finds a request, CM message or handshake waiting (a peer waits on
//     it) turns lingering off for a second (Counters.LingerMisses). A late
//     response or acknowledgment found there does not: nobody waits on
//     it.
//   - Wake (used when a completion that some driver waits for was made by
//     another goroutine) bumps a generation counter and, if a driver is
//     blocked in recvmsg, sends the link's own address an empty datagram
//     (a kick; one in flight at a time, counted in Counters.Kicks) that
//     makes the recvmsg return. A driver publishes that it is about to
//     block and then compares the generation with the one it read before
//     its last ready call, so a Wake either sees the flag or is seen by
//     the driver. The flag is cleared as soon as recvmsg returns, before
//     anything is delivered, so deliveries do not kick an awake driver.
//
// # Sending
//
// Send turns a slice of packets into messages for one sendmmsg system call
// (repeated until every message is out); a lone message goes with sendto
// when it is one buffer (a header alone: a READ request, an ACK), else with
// sendmsg, so that the kernel copies in no mmsghdr vector (and for sendto
// no msghdr or iovec either): the synchronous path sends one message per
// call on each side. With GSO, consecutive packets to
// the same destination where every packet has the length of the first
// except possibly a shorter last one — at most 64 packets and 65507 bytes —
// become a single message with a UDP_SEGMENT control message; the kernel
// (or the NIC) cuts it back into datagrams. Each message's iovec points at
// the callers' Hdr and Payload slices directly; nothing is staged. The
// socket is blocking, so a full send buffer blocks Send rather than
// dropping; EAGAIN and ENOBUFS, if they happen anyway, drop the message and
// count it (the protocol retransmits). The send is an ordinary (not raw)
// system call although it rarely blocks: on loopback the kernel may run
// the receiver it wakes inside it, and a raw call would keep the sender's
// P all that time.
//
// A driver holding the receive token with a done channel waits at most
// rxWaitMax (link.DonePoll, 20 ms) in each receive, so that it sees done
// close even if nobody calls Wake (softnic does not, for a context whose
// deadline is far: see its cq.Drive).
//
// # Offload fallbacks
//
// Open probes UDP_SEGMENT and enables UDP_GRO; a kernel that refuses
// either leaves that offload off (Counters.GSO, Counters.GRO, and
// Counters.GROError say so). When the kernel rejects a GSO message (EIO,
// EINVAL or EMSGSIZE) the link resends its packets one datagram each; if
// that works the offload was at fault: after EIO (no checksum offload on
// the route) GSO is off for the rest of the link's life, after EINVAL or
// EMSGSIZE (segment larger than the path MTU allows) only segments of
// that size and larger are sent without GSO from then on
// (Counters.GSOMaxSegment). Every rejection counts in GSOFallbacks.
//
// # Path MTU: never fragment
//
// The socket sends with IP_PMTUDISC_DO (IPV6_PMTUDISC_DO for IPv6), so the
// kernel never cuts a softnic datagram into IP fragments: fragments defeat
// GRO, and lost or duplicated ones fill the receiver's reassembly memory so
// that every fragmented datagram to that host is dropped for ipfrag_time
// (30 s). A datagram larger than the route allows fails with EMSGSIZE
// instead, is counted (Counters.TooBig) and makes the link forget that
// destination's cached MTU. MaxDatagramTo tells the engine how large a
// datagram may be per destination: the route MTU (IP_MTU read on a probe
// socket, opened in Open so that it lives in the link's network namespace,
// connected to the destination for the look-up) less the IP and UDP
// headers. The first look-up per destination costs a few microseconds
// (Counters.PMTUProbes); later ones read a cache of at most 4,096
// destinations (full, it forgets one at random). On loopback (MTU 65536)
// that is the full 65507 bytes; across an Ethernet path of MTU 1500 it is
// 1472. GSO segments are single datagrams on the wire, so they obey the
// same limit.
//
// # Threading and locks
//
// Send is safe for concurrent use. Its reusable buffers (message headers,
// iovecs, address and control buffers) come from a sync.Pool, so
// concurrent senders never wait for each other's system calls and a
// sender blocked on a full socket buffer holds up nobody. A
// sync.RWMutex, read-held for the length of each Send, guards the file
// descriptor against Close, so a closed descriptor number can never be
// reused under a running send.
//
// # Closing
//
// Close marks the link closing and calls shutdown(SHUT_RDWR) on the
// socket. For an unconnected UDP socket the kernel answers ENOTCONN but
// still sets the shutdown flags and wakes every waiter; a recvmsg that is
// blocked, or that starts later, then returns 0 with no source address.
// Because the flag is state rather than an event, a wakeup cannot be lost
// to a race with the receive goroutine (a wake-up datagram could be
// dropped under a full buffer; a receive timeout would cost periodic
// wakeups). Close then waits for the receive goroutine to exit, waits for
// running Sends to finish, and closes the descriptor. Close is idempotent;
// later calls return nil.
//
// # Counters
//
// Stats returns link.Stats; Counters adds the udplink-specific ones.
// Datagram counters count softnic packets (a GSO message or GRO batch of n
// packets counts n); syscall counters count system calls, so the ratio
// shows how well batching works. RxErrors counts failed receive calls,
// TxErrors packets the kernel refused (including drops), Truncated
// datagrams (only GRO batches can be) larger than the 64 KiB receive
// scratch, whose complete leading packets are still delivered.
//
// udplink needs Linux (UDP GSO since 4.18, GRO since 5.0); on other
// systems Open returns ErrUnsupported.
package udplink

// Package softnictest is an in-memory network for testing the softnic and
// everything built on it. Its Links implement link.Link; the Network
// between them loses, duplicates, reorders, delays and coalesces packets
// at random but reproducibly, runs on a manual or a real clock, and lets a
// test cut, filter and forge traffic.
//
// # Setting up
//
//	clk := softnictest.NewManualClock(time.Time{})
//	n := softnictest.NewNetwork(softnictest.Config{
//		Seed:  1,             // replay a failure with the same seed
//		Drop:  0.05,          // per-packet probabilities
//		Dup:   0.01,
//		Delay: 100 * time.Microsecond,
//		Clock: clk,           // nil: real time
//	})
//	defer n.Close()
//	a, b := n.NewLink(), n.NewLink() // 127.0.0.1:20000, 127.0.0.1:20001
//	// Build two devices on a and b with n.Clock() as their clock, then
//	// drive time:
//	clk.Advance(time.Millisecond)
//
// NewLink hands out loopback addresses with fake ports in a fixed order;
// NewLinkAt picks one (for a device restarting at its old address). No
// real traffic is sent.
//
// # Time and delivery
//
// With a manual Clock nothing moves by itself. Send only queues packets at
// the destination link; ManualClock.Advance moves time, delivering each
// packet and firing each timer when its time comes, in time order, on the
// goroutine that calls Advance; Network.Flush delivers the packets due
// now without moving time or firing timers. Timer callbacks run
// synchronously (see ManualClock). Given the same Seed and the same calls
// from the test, a run makes the same deliveries in the same order at the
// same times, so a failure under random faults can be replayed. With
// Config.AutoFlush, each link also gets a goroutine that delivers what is
// due at the current manual time, for engines that do their own work in
// goroutines; order per link is kept, determinism across links is not.
// The clock still does not move while such a delivery is in progress.
//
// In real time (Config.Clock nil) each started link has one goroutine that
// delivers its queued packets when they fall due. Real time also works in
// a testing/synctest bubble, where delays cost no wall time.
//
// Either way a link's packets are delivered in due-time order (ties in
// send order), and batches reach its Receiver one at a time.
//
// # Faults
//
//   - Config.Drop, Dup, Reorder: per-packet probabilities; Delay and Jitter:
//     latency. Jitter keeps each source-destination pair in order, so
//     Reorder (and Dup, and filter delays) are the only reordering.
//   - Config.Coalesce: consecutive due packets from one source, of GRO's
//     shape (equal sizes but a shorter last), are handed over as one batch.
//   - SetFilter: a function of (from, to, header, payload) returns Pass,
//     Drop, Dup or Delay(d) for each sent packet.
//   - Partition, Isolate, Heal: cut traffic between two addresses or
//     around one.
//   - Inject: deliver arbitrary bytes, malformed packets included, from
//     any address.
//   - Config.QueueLimit: a full receive queue drops, like a socket buffer.
//   - Link.SetRxRate: a link receives at most so many packets per second
//     of clock, like a loaded process; the rest queue (and may drop).
//   - Link.StopReceive, ResumeReceive and ProcessClock: a process stopped
//     and continued (SIGSTOP, SIGCONT) - its socket queues, its timers
//     are held and fire together at Continue.
//
// # Receive path
//
// Delivery follows the contract of package link the way udplink receives
// a GRO datagram, so a suite behaves alike over both. Under
// Receiver.RxLock: if the batch's first header parses, Steer is called for
// every packet i with the FIRST packet's header, index i and the payload
// length that header predicts (the receiver has to predict, as with GRO);
// then the payloads are copied (the kernel's copy): the bytes past the
// predicted header length into the memory Steer returned, everything into
// a scratch buffer; then Deliver is called for every packet with its real
// header. A steered packet whose header length is the predicted one gets
// the steered memory as payload; one whose header length differs (say, a
// first WRITE packet with a RETH batched with middle packets without) is
// delivered from scratch, leaving misplaced bytes in the steered memory.
// Steer returning a slice of the wrong length counts as nil. A datagram
// whose header does not parse gets no Steer and is delivered whole as hdr
// with a nil payload. After each batch the fake overwrites its scratch
// buffers with 0xEE, so a receiver that keeps hdr or an unsteered payload
// past Deliver reads garbage.
//
// # Counters
//
// Network.Counters and Link.Counters count sent, delivered, dropped (and
// why), duplicated, reordered, delayed, coalesced and injected packets,
// and steered, mispredicted and malformed ones on the receive path;
// Link.Stats reports the link.Stats of a link. Once nothing is queued,
// Sent + Injected + Duplicated = Delivered + Dropped.
package softnictest

package baseline

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Host runs the baselines with both ends bound to one local address.
// The zero Host uses 127.0.0.1.
type Host struct {
	// Addr is an IPv4 or IPv6 address of this machine, without a zone.
	Addr netip.Addr
}

// Loopback is the Host the package-level functions use.
var Loopback = Host{Addr: netip.AddrFrom4([4]byte{127, 0, 0, 1})}

// Limits of the arguments.
const (
	// MaxUDPSize is the largest UDP payload the UDP baselines accept (the
	// IPv4 limit).
	MaxUDPSize = 65507
	// MaxOutstanding bounds EchoRate's requests in flight.
	MaxOutstanding = 4096
	// MaxTCPMsgSize bounds TCPBandwidth's message size.
	MaxTCPMsgSize = 1 << 30
)

// ErrNoReply reports that the peer of a baseline stopped answering: a lost
// datagram in a ping-pong, or an echo server that never replied.
var ErrNoReply = errors.New("baseline: no reply")

// udpTimeout is how long a UDP client waits for a reply before it gives
// up (ping-pong) or assumes its requests were lost (echo rate).
const udpTimeout = time.Second

func (h Host) addr() (netip.Addr, error) {
	a := h.Addr
	if !a.IsValid() {
		return Loopback.Addr, nil
	}
	a = a.Unmap()
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("baseline: address %v: zoned addresses are not supported", a)
	}
	return a, nil
}

// UDPPingPong measures iters UDP round trips of size-byte datagrams on
// 127.0.0.1; see Host.UDPPingPong.
func UDPPingPong(iters int, size int) (Latencies, error) {
	return Loopback.UDPPingPong(iters, size)
}

// EchoRate measures echoed requests per second on 127.0.0.1; see
// Host.EchoRate.
func EchoRate(outstanding int, size int, d time.Duration) (opsPerSec float64, err error) {
	return Loopback.EchoRate(outstanding, size, d)
}

// TCPBandwidth measures request/response bandwidth over one TCP connection
// on 127.0.0.1 with one request outstanding; see Host.TCPBandwidth.
func TCPBandwidth(msgSize int, total int64) (bytesPerSec float64, err error) {
	return Loopback.TCPBandwidth(msgSize, total, 1)
}

// TCPConnectRoundTrip measures TCP connection setup plus one round trip on
// 127.0.0.1; see Host.TCPConnectRoundTrip.
func TCPConnectRoundTrip(iters int) (Latencies, error) {
	return Loopback.TCPConnectRoundTrip(iters)
}

func checkUDPArgs(what string, count, size int) error {
	if count < 1 {
		return fmt.Errorf("baseline: %s: count %d < 1", what, count)
	}
	if size < 1 || size > MaxUDPSize {
		return fmt.Errorf("baseline: %s: size %d outside [1, %d]", what, size, MaxUDPSize)
	}
	return nil
}

// Alternate measures the thing under test and the UDP ping-pong (size
// bytes, on 127.0.0.1) in alternating chunks; see AlternateWith.
func Alternate(rounds, n, size int, ours func(k int) error) (Latencies, error) {
	return AlternateWith(rounds, n, ours, func(k int) (Latencies, error) { return UDPPingPong(k, size) })
}

// Warmup is the number of untimed operations a latency measurement of
// this package makes before its timed ones (UDPPingPong, PreadLatency,
// and so each baseline chunk of AlternateWith): they fault in the buffers
// and wake both threads once. The thing under test in AlternateWith
// should do the same at the start of each of its chunks, or it alone pays
// for the switch.
const Warmup = 16

// ChunkOps is about how many operations of each side one round of
// AlternateWith measures when RemoteRounds picks the rounds.
const ChunkOps = 200

// RemoteRounds is how many rounds AlternateWith should alternate n
// operations of each side in when the baseline's server lives on across
// rounds in another process (UDPPingPongTo a RemoteServer's echo,
// PreadLatency of a FUSE floor): chunks of about ChunkOps operations, and
// at least 10 rounds (or n, if fewer).
func RemoteRounds(n int) int { return max(min(10, n), n/ChunkOps) }

// LocalChunkOps is about how many operations of each side one round of
// Alternate measures when LocalRounds picks the rounds.
const LocalChunkOps = 2000

// LocalRounds is how many rounds Alternate should alternate n operations
// of each side in, with the ping-pong's echo in this process and started
// anew for every chunk: chunks of about LocalChunkOps operations, and at
// least 10 rounds (or n, if fewer).
func LocalRounds(n int) int { return max(min(10, n), n/LocalChunkOps) }

// AlternateWith measures the thing under test and a baseline in
// alternating chunks: ours(k) runs k operations of the thing under test,
// then base(k) measures k operations of the baseline, rounds times in all,
// and n operations of each in total. It returns the baseline's latencies.
// On a machine whose speed drifts within seconds, this keeps both figures
// of a ratio under the same conditions; measuring one after the other, as
// the ping-pong in a single block after the thing under test, lets the
// ratio swing with the drift (0.84x-1.41x between quiet runs of one
// build).
//
// How many rounds depends on where the baseline runs; A/A tests (the
// ping-pong as both sides) on a 2-vCPU VM decide it:
//   - Across a veth between two network namespaces, to an echo server in
//     another process (20,000 round trips each): 10 rounds gave ratios of
//     0.997-1.134, 100 rounds 0.992-1.004. With two identical echo servers
//     in two processes as the two sides, 100 rounds still gave 0.98-1.25:
//     the round trip is bimodal on a VM (about 20 us, or 30-90 us when it
//     must wake a halted vCPU; a busy loop at idle priority on each vCPU
//     moved most round trips to the fast mode), the median sits near the
//     boundary between the modes, and which mode a pair of threads gets
//     lasts for seconds; 100,000 round trips each in 500 rounds gave
//     0.986-1.079. Use RemoteRounds and many operations.
//   - On loopback with the echo in this process, started for every chunk
//     (Alternate), 20,000 round trips each: 10 rounds gave 0.966-1.006,
//     100 rounds 0.736-1.665 (every chunk starts a server goroutine and
//     its sockets, and the Go scheduler's placement of the two ends then
//     dominates); an echo kept across rounds gave 0.896-1.065 and
//     0.982-1.112. In a noisier quarter hour, 10 rounds of 2,000 gave
//     0.823-1.317 and 50 rounds of 2,000 (100,000 each) 0.901-1.052. Use
//     LocalRounds and many operations.
func AlternateWith(rounds, n int, ours func(k int) error, base func(k int) (Latencies, error)) (Latencies, error) {
	if rounds < 1 || n < rounds {
		return nil, fmt.Errorf("baseline: Alternate: %d operations in %d rounds", n, rounds)
	}
	out := make(Latencies, 0, n)
	for r := range rounds {
		k := n / rounds
		if r < n%rounds {
			k++
		}
		if err := ours(k); err != nil {
			return nil, err
		}
		lat, err := base(k)
		if err != nil {
			return nil, err
		}
		out = append(out, lat...)
	}
	return out, nil
}

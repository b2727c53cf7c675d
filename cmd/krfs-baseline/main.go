//go:build linux

// Command krfs-baseline runs the baselines of package bench/baseline
// as separate processes, so that scripts/bench.sh can place each end on
// the host (network namespace) where krfs's own end runs and compare krfs
// across a veth with the same veth:
//
//	krfs-baseline serve -addr IP              UDP echo + TCP 1 MiB server; prints "udp=A tcp=A", runs until stdin closes
//	krfs-baseline udp -addr IP -to A -n N     raw UDP ping-pong of -s bytes
//	krfs-baseline tcp -to A -depth D -total B TCP request/response bandwidth of 1 MiB messages
//	krfs-baseline floor -dir D -addr IP -to A FUSE floor server (its own process); prints "path=P", runs until stdin closes
//	krfs-baseline pread -path P -n N          pread latency of -s bytes
//	krfs-baseline prate -path P -t T -d DUR   pread rate of -s bytes with -t threads
//
// The measuring subcommands write a `krfs bench --json` report (package
// bench), so `krfs bench report` reads them like krfs's own runs.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"github.com/krfs/krfs/bench"
	"github.com/krfs/krfs/bench/baseline"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: krfs-baseline serve|udp|tcp|floor|pread|prate [flags]")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "krfs-baseline:", err)
		os.Exit(1)
	}
}

func run(cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1", "local address to bind")
	to := fs.String("to", "", "server address (ip:port)")
	n := fs.Int("n", 20000, "iterations")
	size := fs.Int("s", 8, "bytes per operation")
	depth := fs.Int("depth", 4, "TCP requests outstanding")
	total := fs.Int64("total", 1<<30, "TCP bytes to fetch")
	dir := fs.String("dir", "", "floor mount directory")
	path := fs.String("path", "", "file to pread")
	threads := fs.Int("t", 32, "pread threads")
	dur := fs.Duration("d", 3*time.Second, "pread rate duration")
	if err := fs.Parse(args); err != nil {
		return err
	}
	local, err := netip.ParseAddr(*addr)
	if err != nil {
		return err
	}
	var dst netip.AddrPort
	if *to != "" {
		if dst, err = netip.ParseAddrPort(*to); err != nil {
			return err
		}
	}
	r := &bench.Report{Test: "baseline " + cmd, Mode: "baseline"}
	switch cmd {
	case "serve":
		s, err := baseline.StartRemoteServer(local, 0, 0, 1<<20)
		if err != nil {
			return err
		}
		fmt.Printf("udp=%v tcp=%v\n", s.UDPAddr(), s.TCPAddr())
		io.Copy(io.Discard, os.Stdin)
		return s.Close()
	case "floor":
		stop := make(chan struct{})
		go func() { io.Copy(io.Discard, bufio.NewReader(os.Stdin)); close(stop) }()
		return baseline.ServeFUSEFloor(*dir, local, dst, 1<<20, func(p string) { fmt.Printf("path=%s\n", p) }, stop)
	case "udp":
		l, err := baseline.Host{Addr: local}.UDPPingPongTo(dst, *n, *size)
		if err != nil {
			return err
		}
		r.Target = dst.String()
		r.AddLat("raw UDP ping-pong", bench.NewLatRow("udp", *size, l))
	case "tcp":
		bps, err := baseline.TCPBandwidthTo(dst, 1<<20, *total, *depth)
		if err != nil {
			return err
		}
		r.Target, r.Outstanding = dst.String(), *depth
		r.Bandwidth = []bench.BWRow{{Bytes: 1 << 20, Iterations: int(*total >> 20), AvgMiBs: bps / (1 << 20), PeakMiBs: bps / (1 << 20), MsgRateMpps: bps / (1 << 20) / 1e6}}
	case "pread":
		l, err := baseline.PreadLatency(*path, *n, *size)
		if err != nil {
			return err
		}
		r.Target = *path
		r.AddLat("pread", bench.NewLatRow("pread", *size, l))
	case "prate":
		ops, err := baseline.PreadRate(*path, *threads, *size, *dur)
		if err != nil {
			return err
		}
		r.Target, r.Outstanding = *path, *threads
		r.Bandwidth = []bench.BWRow{{Bytes: *size, AvgMiBs: ops * float64(*size) / (1 << 20), MsgRateMpps: ops / 1e6}}
	default:
		return fmt.Errorf("unknown subcommand %q", cmd)
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

package main

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/krfs/krfs/bench"
	"github.com/krfs/krfs/bench/report"
	"github.com/krfs/krfs/nic"
)

// krfs bench: perftest-style benchmarks, through the Go API against a node
// of a running cluster (--meta, --gid) or through the file interface of a
// mounted krfs (--path). `krfs bench report DIR` turns the outputs of
// scripts/bench.sh into results.json, results.md and plots. The suite
// itself is package bench; this file is its flags.

// benchNIC are the flags of the bench's own NIC (API mode) that do not
// land in bench.Opts directly.
type benchNIC struct {
	backend string
	qos     qosFlags
}

// registerBenchFlags registers the flags of `krfs bench` into o.
func registerBenchFlags(set *pflag.FlagSet, o *bench.Opts, bn *benchNIC) {
	set.StringVar(&bn.backend, "backend", "auto", "API mode: the bench's verbs backend: auto (an RNIC if a usable one exists, else softnic), softnic or rdma")
	set.StringVar(&o.NIC.Device, "device", "", "API mode, rdma: the RDMA device, like mlx5_0 (default: the first usable one)")
	set.IntVar(&o.NIC.Port, "device-port", 0, "API mode, rdma: the device's port number (0: the first active one)")
	set.IntVar(&o.NIC.GIDIndex, "gid-index", -1, "API mode, rdma: the GID table index (-1: the port's RoCEv2 IPv4 GID, or GID 0 on InfiniBand)")
	bn.qos.register(set)
	set.StringVarP(&o.SizeStr, "size", "s", "", "message size, like 8, 4K, 1M (default 8; 1M for *_bw)")
	set.IntVarP(&o.Iters, "iters", "n", 0, "iterations (default 1000 for latency tests, 5000 for bandwidth tests)")
	set.BoolVarP(&o.All, "all", "a", false, "sweep sizes 8 B .. 1 MiB in powers of 2")
	set.IntVarP(&o.Outstanding, "outstanding", "t", 1, "operations outstanding (bandwidth tests)")
	set.Float64VarP(&o.Duration, "duration", "D", 0, "run each size for this many seconds instead of -n iterations")
	set.BoolVar(&o.JSON, "json", false, "print the results as JSON instead of tables")
	set.StringVar(&o.Meta, "meta", "", "API mode: meta service HOST:PORT[,HOST:PORT...] of the cluster (names resolve)")
	set.UintVar(&o.GID, "gid", 0, "API mode: gid of the node to benchmark against")
	set.StringVar(&o.Listen, "listen", "", "API mode: address of the bench process's own NIC (softnic's socket, or the rdma backend's connection manager; default: the address the route to the meta service leaves from, port 0)")
	set.BoolVar(&o.Register, "register", false, "API mode: register the bench node with the meta service (deregistered at exit)")
	set.StringVar(&o.Path, "path", "", "file mode: a region file (or, for send_lat, a port file) of a mounted krfs")
	set.StringVar(&o.Region, "region", "mem", "API mode: the peer's region")
	set.UintVar(&o.Port, "port", 1, "API mode, send_lat: the peer's port (someone must be reading it)")
	set.BoolVar(&o.Baseline, "baseline", false, "also measure the matching same-run baseline (UDP ping-pong, sendmmsg echo, TCP) and print ratios")
	set.StringVar(&o.BaselineEcho, "baseline-echo", "", "latency tests: the ping-pong goes to this UDP echo server (IP:PORT, krfs-baseline serve) instead of one on 127.0.0.1; implies --baseline")
	set.StringVar(&o.BaselineMetaEcho, "baseline-meta-echo", "", "connect: with --baseline-echo (an echo on the peer's host), the baseline is one UDP round trip to this echo on the meta service's host, then one to the peer's, after every cold connect + first READ; implies --baseline")
	set.StringVar(&o.BaselineFloor, "baseline-floor", "", "latency tests: the baseline is pread of this file (a FUSE floor, krfs-baseline floor) instead of a UDP ping-pong; implies --baseline")
	set.StringVar(&o.Progress, "progress", "auto", "progress bar on stderr: auto (when stderr is a terminal), on, off")
	set.StringVar(&o.Transport, "transport", "auto", "API mode: auto (qpcore's hybrid policy), dc (never switch to RC), rc (make the peer hot first and wait for its RC QP)")
	set.DurationVar(&o.Timeout, "timeout", 10*time.Second, "give up on one operation after this long")
}

// benchLong lists the tests for `krfs bench --help`.
func benchLong() string {
	var b strings.Builder
	b.WriteString("Perftest-style benchmarks: through the Go API against a node of a running\n")
	b.WriteString("cluster (--meta HOST:PORT --gid N) or through the file interface of a\n")
	b.WriteString("mounted krfs (--path FILE).\n\nTests:\n")
	for _, t := range bench.Tests {
		fmt.Fprintf(&b, "  %-14s %s\n", t.Name, t.Help)
	}
	b.WriteString("  report DIR     (for scripts/bench.sh) write DIR/results.{json,md} and plots from DIR/raw\n")
	return b.String()
}

func benchCmd(stdout, stderr io.Writer) *cobra.Command {
	o := &bench.Opts{}
	bn := &benchNIC{}
	cmd := &cobra.Command{
		Use:     "bench TEST [flags]",
		Short:   "Perftest-style benchmarks (API mode: --meta HOST:PORT --gid N; file mode: --path FILE)",
		Long:    benchLong(),
		Example: "  krfs bench read_lat --path /mnt/krfs/peers/$(ls /mnt/krfs/peers | head -1)/mem\n  krfs bench read_bw --meta 10.0.0.1:4791 --gid 2 -a --baseline",
		Args:    cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 && args[0] == "report" {
				if len(args) != 2 {
					return fmt.Errorf("%w: bench report DIR", errUsage)
				}
				return report.Dir(args[1], stdout)
			}
			if err := finishBenchArgs(o, bn, args); err != nil {
				return err
			}
			return bench.Main(o, stdout, stderr)
		},
	}
	registerBenchFlags(cmd.Flags(), o, bn)
	return cmd
}

// finishBenchArgs checks the positional arguments and the flags of `krfs
// bench`, resolves --meta and picks --listen from the route to it.
func finishBenchArgs(o *bench.Opts, bn *benchNIC, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("%w: one TEST expected, got %d (API mode: --meta HOST:PORT --gid N; file mode: --path FILE)", errUsage, len(args))
	}
	o.Test = args[0]
	var err error
	if o.NIC.Backend, err = nic.ParseBackend(bn.backend); err != nil {
		return fmt.Errorf("%w: --backend: %v", errUsage, err)
	}
	bn.qos.apply(&o.NIC)
	if o.SizeStr != "" {
		if o.Size, err = parseSize(o.SizeStr); err != nil {
			return err
		}
	}
	if o.Meta != "" {
		servers, err := resolveMeta(o.Meta)
		if err != nil {
			return err
		}
		var list []string
		for _, s := range servers {
			list = append(list, s.String())
		}
		o.Meta = strings.Join(list, ",")
		if o.Listen == "" && len(servers) > 0 {
			src, err := routeSource(servers[0])
			if err != nil {
				return err
			}
			o.Listen = netip.AddrPortFrom(src, 0).String()
		}
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	return o.Validate()
}

// parseBenchArgs parses `krfs bench` arguments (tests use it).
func parseBenchArgs(args []string, stderr io.Writer) (*bench.Opts, error) {
	o, bn := &bench.Opts{}, &benchNIC{}
	set := pflag.NewFlagSet("krfs bench", pflag.ContinueOnError)
	set.SetOutput(stderr)
	registerBenchFlags(set, o, bn)
	if err := set.Parse(args); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := finishBenchArgs(o, bn, set.Args()); err != nil {
		return nil, err
	}
	return o, nil
}

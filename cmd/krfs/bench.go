package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/krfs/krfs/internal/bench"
	"github.com/krfs/krfs/internal/bench/report"
)

// krfs bench: perftest-style benchmarks, through the Go API against a node
// of a running cluster (--meta, --gid) or through the file interface of a
// mounted krfs (--path). `krfs bench report DIR` turns the outputs of
// scripts/bench.sh into results.json, results.md and plots. The suite
// itself is package internal/bench; this file is its flags.

// parseBenchArgs parses `krfs bench` arguments; the test name may come
// before or after the flags.
func parseBenchArgs(args []string, stderr io.Writer) (*bench.Opts, error) {
	o := &bench.Opts{}
	set := flag.NewFlagSet("krfs bench", flag.ContinueOnError)
	set.SetOutput(stderr)
	set.StringVar(&o.SizeStr, "s", "", "message size, like 8, 4K, 1M (default 8; 1M for *_bw)")
	set.IntVar(&o.Iters, "n", 0, "iterations (default 1000 for latency tests, 5000 for bandwidth tests)")
	set.BoolVar(&o.All, "a", false, "sweep sizes 8 B .. 1 MiB in powers of 2")
	set.IntVar(&o.Outstanding, "t", 1, "operations outstanding (bandwidth tests)")
	set.Float64Var(&o.Duration, "D", 0, "run each size for this many seconds instead of -n iterations")
	set.BoolVar(&o.JSON, "json", false, "print the results as JSON instead of tables")
	set.StringVar(&o.Meta, "meta", "", "API mode: meta service HOST:PORT[,HOST:PORT...] of the cluster")
	set.UintVar(&o.GID, "gid", 0, "API mode: gid of the node to benchmark against")
	set.StringVar(&o.Listen, "listen", "127.0.0.1:0", "API mode: address of the bench process's own software NIC")
	set.BoolVar(&o.Register, "register", false, "API mode: register the bench node with the meta service (deregistered at exit)")
	set.StringVar(&o.Path, "path", "", "file mode: a region file (or, for send_lat, a port file) of a mounted krfs")
	set.StringVar(&o.Region, "region", "mem", "API mode: the peer's region")
	set.UintVar(&o.Port, "port", 1, "API mode, send_lat: the peer's port (someone must be reading it)")
	set.BoolVar(&o.Baseline, "baseline", false, "also measure the matching same-run baseline (UDP ping-pong, sendmmsg echo, TCP) and print ratios")
	set.StringVar(&o.Progress, "progress", "auto", "progress bar on stderr: auto (when stderr is a terminal), on, off")
	set.StringVar(&o.Transport, "transport", "auto", "API mode: auto (qpcore's hybrid policy), dc (never switch to RC), rc (make the peer hot first and wait for its RC QP)")
	set.DurationVar(&o.Timeout, "timeout", 10*time.Second, "give up on one operation after this long")
	set.Usage = func() {
		fmt.Fprintln(stderr, "usage: krfs bench TEST [flags]  (API mode: --meta HOST:PORT --gid N; file mode: --path FILE)")
		fmt.Fprintln(stderr, "tests:")
		for _, t := range bench.Tests {
			fmt.Fprintf(stderr, "  %-12s %s\n", t.Name, t.Help)
		}
		fmt.Fprintln(stderr, "  report DIR   (for scripts/bench.sh) write DIR/results.{json,md} and plots from DIR/raw")
		fmt.Fprintln(stderr, "flags:")
		set.PrintDefaults()
	}
	pos, err := parseInterleaved(set, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 1 {
		set.Usage()
		return nil, fmt.Errorf("%w: one TEST expected, got %d", errUsage, len(pos))
	}
	o.Test = pos[0]
	if o.SizeStr != "" {
		if o.Size, err = parseSize(o.SizeStr); err != nil {
			return nil, err
		}
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return o, nil
}

// runBench is `krfs bench`.
func runBench(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "report" {
		if len(args) != 2 {
			return fmt.Errorf("%w: bench report DIR", errUsage)
		}
		return report.Dir(args[1], stdout)
	}
	o, err := parseBenchArgs(args, stderr)
	if err != nil {
		return err
	}
	return bench.Main(o, stdout, stderr)
}

// Command krfs runs a krfs node, a meta service, and the tools around
// them.
//
//	krfs mount MOUNTPOINT [flags]   run a node and mount its filesystem
//	krfs meta --listen ADDR         run a standalone meta service
//	krfs atomic faa FILE OFFSET DELTA
//	krfs atomic cas FILE OFFSET COMPARE SWAP
//	krfs res MOUNTPOINT qp|mr|peer [-j]
//	krfs version
//
// Run `krfs CMD -h` for the flags of a command.
package main

import (
	"errors"
	"flag"
	"fmt"
	"github.com/krfs/krfs/internal/bench"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

type command struct {
	name  string
	usage string
	run   func(args []string, stdout, stderr io.Writer) error
}

var commands []command

func init() {
	commands = []command{
		{"mount", "mount MOUNTPOINT [flags]: run a node and mount it", runMount},
		{"meta", "meta --listen ADDR: run a standalone meta service", runMeta},
		{"atomic", "atomic faa FILE OFFSET DELTA | atomic cas FILE OFFSET COMPARE SWAP", runAtomic},
		{"res", "res MOUNTPOINT qp|mr|peer [-j]: list QPs, regions or peers, like rdma res show", runRes},
		{"bench", "bench TEST [flags]: perftest-style benchmarks", runBench},
		{"version", "version: print the version", func([]string, io.Writer, io.Writer) error {
			fmt.Println("krfs", Version)
			return nil
		}},
	}
}

// errUsage marks an error whose message is a usage hint (exit status 2).
// errUsage marks command-line errors (exit status 2, usage printed).
var errUsage = bench.ErrUsage

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

func run(argv []string, stdout, stderr io.Writer) int {
	args := argv[1:]
	if filepath.Base(argv[0]) == "mount.fuse.krfs" {
		args = append([]string{"mount"}, mountHelperArgs(args)...)
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			err := c.run(args[1:], stdout, stderr)
			switch {
			case err == nil:
				return 0
			case errors.Is(err, flag.ErrHelp):
				return 0
			case errors.Is(err, errUsage):
				fmt.Fprintf(stderr, "krfs %s: %v\n", c.name, err)
				return 2
			default:
				fmt.Fprintf(stderr, "krfs %s: %v\n", c.name, err)
				return 1
			}
		}
	}
	fmt.Fprintf(stderr, "krfs: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: krfs COMMAND [arguments]")
	for _, c := range commands {
		fmt.Fprintf(w, "  krfs %s\n", c.usage)
	}
}

// logFlags are the logging flags every long-running command takes.
type logFlags struct {
	level, format string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
}

func (l *logFlags) logger(w io.Writer) (*logrus.Logger, error) {
	log := logrus.New()
	log.SetOutput(w)
	lvl, err := logrus.ParseLevel(l.level)
	if err != nil {
		return nil, fmt.Errorf("%w: --log-level %q: want debug, info, warn or error", errUsage, l.level)
	}
	log.SetLevel(lvl)
	switch l.format {
	case "text":
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	case "json":
		log.SetFormatter(&logrus.JSONFormatter{})
	default:
		return nil, fmt.Errorf("%w: --log-format %q: want text or json", errUsage, l.format)
	}
	return log, nil
}

// parseSize parses sizes like 4096, 64K, 16M, 1G (powers of 1024).
func parseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mul := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mul, t = 1<<10, t[:n-1]
		case 'M':
			mul, t = 1<<20, t[:n-1]
		case 'G':
			mul, t = 1<<30, t[:n-1]
		case 'T':
			mul, t = 1<<40, t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 || v > (1<<40)/mul {
		return 0, fmt.Errorf("%w: size %q: want a number with an optional K, M, G or T suffix", errUsage, s)
	}
	return v * mul, nil
}

// parseInterleaved parses flags that may stand before, between or after
// the positional arguments (krfs mount /mnt --gid 2, krfs mount --gid 2
// /mnt) and returns the positional ones.
func parseInterleaved(set *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for len(args) > 0 {
		if err := set.Parse(args); err != nil {
			return nil, err
		}
		args = set.Args()
		if len(args) > 0 {
			pos = append(pos, args[0])
			args = args[1:]
		}
	}
	return pos, nil
}

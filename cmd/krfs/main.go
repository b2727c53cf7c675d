// Command krfs runs a krfs node, a meta service, and the tools around
// them.
//
//	krfs mount MOUNTPOINT [flags]   run a node and mount its filesystem
//	krfs meta --listen ADDR         run a standalone meta service
//	krfs atomic faa FILE OFFSET DELTA
//	krfs atomic cas FILE OFFSET COMPARE SWAP
//	krfs res MOUNTPOINT qp|mr|peer [-j]
//	krfs bench TEST [flags]         perftest-style benchmarks
//	krfs devices [-j]               list RDMA devices (RNICs)
//	krfs completion bash|zsh|fish   shell completion script
//	krfs man DIR                    write man pages into DIR
//	krfs version
//
// The command line is spf13/cobra: `krfs CMD --help` for any command,
// flags before, between or after the arguments. Exit status: 0 success,
// 1 failure (and `atomic cas` that did not swap), 2 bad usage.
//
// Installed as mount.fuse.krfs, the binary is mount(8)'s helper:
// `mount -t fuse.krfs krfs DIR -o OPTS` runs `krfs mount DIR -o OPTS`.
package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"

	"github.com/krfs/krfs/bench"
	"github.com/krfs/krfs/internal/units"
)

// Version, Commit and BuildDate are set by `make build` with -ldflags
// "-X main.Version=..."; when empty, the build information Go records
// (module version, vcs.revision, vcs.time) fills them.
var Version, Commit, BuildDate = "", "", ""

// errUsage marks command-line errors (exit status 2, one line and a hint
// to run --help).
var errUsage = bench.ErrUsage

// mountArgs are the arguments of `krfs mount`, for --daemon.
var mountArgs []string

// errNotSwapped is `atomic cas` that found another value (exit status 1).
var errNotSwapped = errors.New("not swapped")

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// run runs the command line argv and returns the exit status.
func run(argv []string, stdout, stderr io.Writer) int {
	args := argv[1:]
	if filepath.Base(argv[0]) == "mount.fuse.krfs" {
		args = append([]string{"mount"}, mountHelperArgs(args)...)
	}
	if len(args) > 0 && args[0] == "mount" {
		mountArgs = args[1:] // what a --daemon child re-runs
	}
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	name := "krfs"
	if cmd != nil && cmd != root {
		name = cmd.CommandPath()
	}
	if errors.Is(err, errNotSwapped) {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	if errors.Is(err, errUsage) || isCobraUsage(err) {
		msg := strings.TrimPrefix(err.Error(), errUsage.Error()+": ")
		fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", name, msg, name)
		return 2
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return 1
}

// isCobraUsage recognizes cobra's own command-line errors.
func isCobraUsage(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "unknown command") || strings.HasPrefix(s, "unknown flag") ||
		strings.HasPrefix(s, "unknown shorthand") || strings.Contains(s, "requires at least") ||
		strings.HasPrefix(s, "accepts ")
}

// newRoot builds the command tree.
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "krfs",
		Short: "KRCORE's RDMA control plane as a FUSE filesystem",
		Long: `krfs runs a node that hands applications virtual QPs to any peer of the
cluster through files: /MOUNT/peers/GID/REGION is a peer's memory region
(pread, pwrite, atomics by ioctl), /MOUNT/regions/ this node's own regions,
/MOUNT/ports/ its message ports.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_ = cmd.Help()
			return fmt.Errorf("%w: no command given", errUsage)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return fmt.Errorf("%w: %v", errUsage, err) })
	root.AddCommand(mountCmd(stdout, stderr), metaCmd(stderr), atomicCmd(stdout), resCmd(stdout),
		benchCmd(stdout, stderr), devicesCmd(stdout), purgeCmd(stdout), manCmd(), versionCmd(stdout))
	addCompletions(root)
	return root
}

// exactArgs is cobra.ExactArgs with a usage error naming the arguments.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return fmt.Errorf("%w: want %s, got %d arguments", errUsage, what, len(args))
		}
		return nil
	}
}

func versionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and build data",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintln(stdout, versionString())
			return nil
		},
	}
}

// versionString is "krfs VERSION (commit C, DATE[, modified]) GO".
func versionString() string {
	v, rev, at, dirty, gov := Version, Commit, BuildDate, false, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		gov = bi.GoVersion
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = cmp.Or(rev, s.Value)
			case "vcs.time":
				at = cmp.Or(at, s.Value)
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	out := "krfs " + v
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		out += " commit " + rev
		if at != "" {
			out += " built " + at
		}
		if dirty {
			out += " (modified)"
		}
	} else {
		out += " (no commit recorded: built outside a git checkout, with -buildvcs=false, or not by make)"
	}
	return out + " " + gov
}

func manCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "man DIR",
		Short: "Write the man pages of krfs and its commands into DIR",
		Args:  exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			hdr := &doc.GenManHeader{Title: "KRFS", Section: "8", Source: "krfs " + Version}
			return doc.GenManTree(cmd.Root(), hdr, args[0])
		},
	}
}

// logFlags are the logging flags every long-running command takes.
type logFlags struct {
	level, format string
}

func (l *logFlags) register(fs *pflag.FlagSet) {
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

// parseSize parses sizes like 4096, 64K, 16M, 1G (units.ParseBytes); a
// bad one is a usage error.
func parseSize(s string) (int64, error) {
	v, err := units.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errUsage, err)
	}
	return v, nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/internal/shm"
	"github.com/krfs/krfs/nic"
	"github.com/krfs/krfs/node"
	"github.com/krfs/krfs/qpcore"
)

type mountFlags struct {
	meta        string
	listen      string
	gid         uint
	memSize     string
	shmDir      string
	keyFile     string
	encrypt     bool
	timeout     time.Duration
	allowOther  bool
	defaultPerm bool
	dcis        int
	rcCap       int
	debugFUSE   bool
	transport   string // --fuse-transport
	ringBatch   int    // --fuse-ring-batch
	metricsAddr string
	daemon      bool
	logFile     string
	backend     string
	rdma        rdmaFlags
	qos         qosFlags
	options     []string // -o, mount(8) style
	maxRegions  int
	maxRegSize  string
	portDepth   int
	memCache    string
	memLimit    string
	fuseOpts    []string                                          // generic mount options handed to the kernel
	limits      struct{ maxRegionSize, memCache, memLimit int64 } // parsed maxRegSize, memCache, memLimit (0: off)
	log         logFlags
}

func (f *mountFlags) register(set *pflag.FlagSet) {
	set.StringVar(&f.meta, "meta", "", "meta service addresses HOST:PORT[,HOST:PORT...] (names resolve); empty: run an embedded one on --listen")
	set.StringVar(&f.listen, "listen", "", "address of this node's software NIC (softnic; default "+defaultSoftnicListen+"), or of the rdma backend's connection manager (default: the GID's IP, port 4792; never 4791, RoCEv2's)")
	set.UintVar(&f.gid, "gid", 0, "this node's gid (0: assigned by the meta service)")
	set.StringVar(&f.memSize, "mem-size", "16M", "size of the default region mem (like 16M, 1G)")
	set.StringVar(&f.shmDir, "shm-dir", "", "directory of the region files (default /dev/shm/krfs-GID)")
	set.StringVar(&f.keyFile, "cluster-key-file", "", "file holding the cluster secret: every packet is authenticated with it")
	set.BoolVar(&f.encrypt, "encrypt", false, "also encrypt payloads (AES-256-GCM; needs --cluster-key-file, and every node must agree)")
	set.DurationVar(&f.timeout, "timeout", time.Second, "how long an operation to an unresponsive peer takes to fail")
	set.BoolVar(&f.allowOther, "allow-other", false, "let users other than root use the mount")
	set.BoolVar(&f.defaultPerm, "default-permissions", false, "let the kernel enforce file modes and owners")
	set.IntVar(&f.dcis, "dcis", 0, "DCI pool size (0: qpcore's default)")
	set.IntVar(&f.rcCap, "rc-cap", 0, "most RC QPs this node opens (0: qpcore's default)")
	set.BoolVar(&f.debugFUSE, "debug-fuse", false, "log every FUSE request")
	set.IntVar(&f.ringBatch, "fuse-ring-batch", 1, "FUSE over io_uring: the ring entries of a CPU one thread serves, 1-8. 1: a thread per entry, so a request that waits (a WRITE to a silent peer) holds up nothing else. More: a thread keeps serving while the READs it posted are on the wire (about twice the rate of many small concurrent reads), but a request that waits holds up the thread's other entries; see docs/operations.md")
	set.StringVar(&f.transport, "fuse-transport", fs.TransportAuto, "how FUSE requests reach krfs: auto (FUSE over io_uring when the kernel offers it, else /dev/fuse, saying why once; the default), uring (io_uring or fail) or dev (go-fuse's /dev/fuse loop); see docs/operations.md")
	set.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this HOST:PORT at /metrics (empty: off)")
	set.BoolVar(&f.daemon, "daemon", false, "detach: run in the background and return once the mount is up (without it krfs mount stays in the foreground until unmounted or interrupted)")
	set.StringVar(&f.logFile, "log-file", "", "append the log to this file (default stderr; with --daemon /var/log/krfs/krfs-GID.log)")
	set.StringVar(&f.backend, "backend", "auto", "verbs backend: auto (an RNIC if a usable one exists, else softnic), softnic or rdma")
	f.rdma.register(set)
	f.qos.register(set)
	set.StringArrayVarP(&f.options, "options", "o", nil, "mount options OPT[,OPT...] as mount(8) gives them: krfs flags (meta=ADDR, gid=N, allow_other...) and generic ones (see krfs mount --help)")
	set.IntVar(&f.maxRegions, "max-regions", qpcore.DefaultMaxRegions, "regions this node may export, mem included (at most 4096)")
	set.StringVar(&f.maxRegSize, "max-region-size", "1T", "largest size of one region (a write or truncate past it fails with EFBIG)")
	set.IntVar(&f.portDepth, "port-depth", qpcore.DefaultPortDepth, "messages queued on one port before its senders are held back")
	set.StringVar(&f.memCache, "mem-cache", "8M", "bytes of caller buffers the automatic registration cache may keep registered")
	set.StringVar(&f.memLimit, "mem-limit", "auto", "soft limit of the daemon's memory (the Go runtime's, as GOMEMLIMIT): auto (56M + --mem-cache), a size like 64M, or off; GOMEMLIMIT in the environment wins")
	f.log.register(set)
}

const mountLong = `Run a krfs node and mount its filesystem at MOUNTPOINT.

krfs mount stays in the foreground until the filesystem is unmounted
(umount MOUNTPOINT) or it gets SIGINT/SIGTERM; --daemon detaches and
returns once the mount is up. Without --meta the node runs an embedded
meta service on its own --listen address, which other nodes join with
--meta.

-o takes mount(8) options. krfs options are flag names with _ for -
(meta=10.0.0.1:4791, gid=3, mem_size=1G, allow_other). Generic options:
nosuid, nodev, noexec, suid, dev, exec are applied; rw, async, sync,
atime, noatime, relatime, strictatime, nodiratime, lazytime are accepted
(krfs keeps no access times, and every write has reached the peer's memory
when it returns); ro is refused (peers write a node's regions). fstab-only
options (_netdev, nofail, noauto, defaults, x-systemd.*) are ignored.`

func mountCmd(stdout, stderr io.Writer) *cobra.Command {
	f := &mountFlags{}
	cmd := &cobra.Command{
		Use:     "mount MOUNTPOINT [flags]",
		Short:   "Run a node and mount its filesystem (stays in the foreground; --daemon detaches)",
		Long:    mountLong,
		Example: "  krfs mount /mnt/krfs\n  krfs mount /mnt/krfs --listen 10.0.0.2:4791 --meta 10.0.0.1:4791\n  mount -t fuse.krfs krfs /mnt/krfs -o meta=10.0.0.1:4791,noatime",
		Args:    exactArgs(1, "one MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runMount(cmd, f, args[0], mountArgs, stdout, stderr)
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// applyOptions applies -o options: krfs ones set their flag, generic ones
// are applied, accepted or refused with a one-line reason.
func applyOptions(cmd *cobra.Command, f *mountFlags) error {
	for _, list := range f.options {
		for _, o := range strings.Split(list, ",") {
			k, v, hasV := strings.Cut(strings.TrimSpace(o), "=")
			switch {
			case k == "":
			case fstabOnly(k):
			case k == "nosuid" || k == "nodev" || k == "noexec" || k == "suid" || k == "dev" || k == "exec":
				f.fuseOpts = append(f.fuseOpts, k)
			case k == "rw" || k == "async" || k == "sync" || k == "dirsync" || k == "atime" || k == "noatime" ||
				k == "relatime" || k == "norelatime" || k == "strictatime" || k == "diratime" || k == "nodiratime" ||
				k == "lazytime" || k == "nolazytime" || k == "silent" || k == "loud":
			case k == "ro":
				return fmt.Errorf("%w: mount option ro: krfs has no read-only mode (peers write this node's regions); use file modes", errUsage)
			default:
				name := strings.ReplaceAll(k, "_", "-")
				fl := cmd.Flags().Lookup(name)
				if fl == nil || name == "options" {
					return fmt.Errorf("%w: unknown mount option %q (see krfs mount --help)", errUsage, k)
				}
				if !hasV {
					if fl.Value.Type() != "bool" {
						return fmt.Errorf("%w: mount option %s needs a value (%s=...)", errUsage, k, k)
					}
					v = "true"
				}
				if err := fl.Value.Set(v); err != nil {
					return fmt.Errorf("%w: mount option %s=%s: %v", errUsage, k, v, err)
				}
			}
		}
	}
	return nil
}

func runMount(cmd *cobra.Command, f *mountFlags, mnt string, orig []string, stdout, stderr io.Writer) (err error) {
	// The daemon's threads spend their time blocked in system calls (go-fuse's
	// readers of /dev/fuse, softnic's recvmsg); with GOMAXPROCS = vCPUs every P
	// is often parked in one and each wake-up needs sysmon or a spare thread.
	// 8 measured fewer context switches per FUSE pread across a veth (4.8
	// vs 5.2-5.9 on 2 vCPUs); an explicit GOMAXPROCS in the environment wins.
	// FUSE over io_uring adds threads locked to their ring and pinned to its
	// CPU (fs/fuseserve), blocked in io_uring_enter between requests; each
	// needs a P to run the request it woke for, which 8 Ps keep at hand.
	if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) < 8 {
		runtime.GOMAXPROCS(8)
	}
	// A daemon child reports how the mount went to its parent.
	ready := daemonChild()
	if ready != nil {
		defer func() { ready.done(err) }()
	}
	if err := applyOptions(cmd, f); err != nil {
		return err
	}
	if isMountHelper() {
		f.daemon = true // mount(8) waits for its helper to exit
	}
	// Every flag is checked before detaching: a usage error exits 2 and
	// says why on the terminal, with --daemon as without (mountcheck.go).
	mem, backend, err := f.validate()
	if err != nil {
		return err
	}
	if f.daemon && ready == nil {
		return daemonize(orig, f, mnt, stdout)
	}
	logw := stderr
	if f.logFile != "" && ready == nil {
		lf, err := openLogFile(f.logFile)
		if err != nil {
			return err
		}
		defer lf.Close()
		logw = lf
	}
	log, err := f.log.logger(logw)
	if err != nil {
		return err
	}
	servers, err := resolveMeta(f.meta)
	if err != nil {
		return err
	}
	if err := checkFUSE(); err != nil {
		return err
	}
	cleaned, err := checkMountpoint(mnt)
	if err != nil {
		return err
	}
	if cleaned {
		log.Warnf("cleaned up a stale mount at %s left by a crashed daemon", mnt)
	}

	log.Info(node.SetMemoryLimit(f.limits.memLimit))
	n, err := startNode(log, f, backend, servers, mem)
	if err != nil {
		return err
	}
	defer n.Close()

	var be fs.Backend = n
	if f.metricsAddr != "" {
		ops := node.NewOpMetrics()
		_, stop, err := node.ServeMetrics(log, f.metricsAddr, node.Registry(n, ops))
		if err != nil {
			n.CloseAndDiscard()
			return fmt.Errorf("--metrics-addr %s: %w", f.metricsAddr, err)
		}
		defer stop()
		be = node.Metered(n, ops)
	}

	// Catch signals before mounting: killed while go-fuse's WaitMount polls
	// a file of the mount itself, the daemon would hang in that request for
	// good (docs/operations.md); a stop request unmounts instead.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	srv, err := fs.Mount(mnt, be, fs.Options{AllowOther: f.allowOther, DefaultPermissions: f.defaultPerm, MaxRegionSize: f.limits.maxRegionSize,
		Timeout: f.timeout + time.Second, Debug: f.debugFUSE, Logf: log.Warnf, MountOptions: f.fuseOpts, Transport: f.transport, RingEntriesPerThread: f.ringBatch,
		Poll: true}) // the daemon opens no file of its own mount (fs.Options.Poll)
	if err != nil {
		n.CloseAndDiscard() // a failed mount leaves no region directory behind
		return fmt.Errorf("mount %s: %w", mnt, err)
	}
	n.SetFuseStats(srv.Stats)
	log.WithFields(logrus.Fields{"mountpoint": mnt, "gid": n.Core().GID(), "address": n.Device().Addr(),
		"meta": n.MetaDesc()}).Info(servingMessage(ready != nil))
	notifyReady()
	if ready != nil {
		ready.done(nil)
	}

	served := make(chan struct{})
	go func() { srv.Wait(); close(served) }()
	select {
	case s := <-sigs:
		log.Infof("%v: unmounting %s", s, mnt)
		if err := srv.Unmount(); err != nil {
			log.Warnf("unmount %s: %v; detaching it", mnt, err)
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	case <-served:
		// umount(8) already took the mount away: unmounting again would
		// fail with EINVAL (after go-fuse's retries) and log a warning.
		log.Infof("%s was unmounted", mnt)
	}
	return nil
}

// defaultSoftnicListen is softnic's --listen when none is given.
const defaultSoftnicListen = "127.0.0.1:4791"

// startNode opens the NIC on --listen and starts a node on it as the
// mount flags say.
func startNode(log *logrus.Logger, f *mountFlags, backend nic.Backend, servers []netip.AddrPort, mem int64) (*node.Node, error) {
	key, err := readClusterKey(f.keyFile)
	if err != nil {
		return nil, err
	}
	id, err := nodeIdentity(log, f, backend)
	if err != nil {
		return nil, err
	}
	if f.encrypt && len(key) == 0 {
		return nil, fmt.Errorf("%w: --encrypt needs --cluster-key-file", errUsage)
	}
	no := nic.Options{Backend: backend, Listen: f.listen, DefaultListen: defaultSoftnicListen, ClusterKey: key, Encrypt: f.encrypt}
	f.rdma.apply(&no)
	f.qos.apply(&no)
	opened, err := nic.Open(no)
	listen := f.listen
	if listen == "" {
		listen = "the default address"
	}
	switch {
	case errors.Is(err, unix.EADDRINUSE):
		return nil, fmt.Errorf("--listen %v is in use (another krfs node?): %w", listen, err)
	case errors.Is(err, nic.ErrRDMAUnavailable):
		return nil, fmt.Errorf("--backend %s: %w", backend, err)
	case err != nil:
		return nil, fmt.Errorf("opening the NIC (--backend %s) on %v: %w", backend, listen, err)
	}
	log.WithFields(logrus.Fields{"backend": opened.Backend, "transport": opened.Transport, "dc": opened.DC}).
		Infof("NIC: %s", opened.Reason)
	if !opened.DC {
		log.Warnf("NIC has no DC transport (%s): RC only", opened.DCNote)
	}
	return node.Start(context.Background(), node.Config{
		Device: opened.Dev,
		Meta:   servers,
		QPCore: qpcore.Config{GID: id.gid, DCIs: f.dcis, RCCap: f.rcCap, PeerTimeout: f.timeout,
			NoDC: !opened.DC, Transport: opened.Transport, MaxRegions: f.maxRegions, PortDepth: f.portDepth,
			MemCacheSize: int(f.limits.memCache)},
		MemSize:       mem,
		MaxRegionSize: f.limits.maxRegionSize,
		ShmDir:        f.shmDir,
		// The meta service is a peer too: --timeout bounds a listing's query.
		MetaTimeout: f.timeout,
		NodeKey:     id.key,
		Reclaimed:   id.reclaimed,
	}, log)
}

// storeDir is the region store's directory: --shm-dir, or the default for
// gid.
func storeDir(shmDir string, gid uint32) string {
	if shmDir != "" {
		return shmDir
	}
	return shm.DefaultDir(gid)
}

// notifyReady tells systemd (Type=notify) that the mount is up.
func notifyReady() {
	sock := os.Getenv("NOTIFY_SOCKET")
	if sock == "" {
		return
	}
	if strings.HasPrefix(sock, "@") {
		sock = "\x00" + sock[1:]
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	_ = unix.Sendto(fd, []byte("READY=1"), 0, &unix.SockaddrUnix{Name: sock})
}

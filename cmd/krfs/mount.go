package main

import (
	"context"
	"errors"
	"flag"
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
	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/internal/shm"
	"github.com/krfs/krfs/node"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs/softnic"
)

type mountFlags struct {
	meta        string
	listen      string
	gid         uint
	memSize     string
	shmDir      string
	keyFile     string
	timeout     time.Duration
	allowOther  bool
	defaultPerm bool
	dcis        int
	rcCap       int
	debugFUSE   bool
	metricsAddr string
	daemon      bool
	logFile     string
	log         logFlags
}

func (f *mountFlags) register(set *flag.FlagSet) {
	set.StringVar(&f.meta, "meta", "", "meta service addresses HOST:PORT[,HOST:PORT...]; empty: run an embedded one on --listen")
	set.StringVar(&f.listen, "listen", "127.0.0.1:4791", "address of this node's software NIC")
	set.UintVar(&f.gid, "gid", 0, "this node's gid (0: assigned by the meta service)")
	set.StringVar(&f.memSize, "mem-size", "16M", "size of the default region mem (like 16M, 1G)")
	set.StringVar(&f.shmDir, "shm-dir", "", "directory of the region files (default /dev/shm/krfs-GID)")
	set.StringVar(&f.keyFile, "cluster-key-file", "", "file holding the cluster secret: every packet is authenticated with it")
	set.DurationVar(&f.timeout, "timeout", time.Second, "how long an operation to an unresponsive peer takes to fail")
	set.BoolVar(&f.allowOther, "allow-other", false, "let users other than root use the mount")
	set.BoolVar(&f.defaultPerm, "default-permissions", false, "let the kernel enforce file modes and owners")
	set.IntVar(&f.dcis, "dcis", 0, "DCI pool size (0: qpcore's default)")
	set.IntVar(&f.rcCap, "rc-cap", 0, "most RC QPs this node opens (0: qpcore's default)")
	set.BoolVar(&f.debugFUSE, "debug-fuse", false, "log every FUSE request")
	set.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this HOST:PORT at /metrics (empty: off)")
	set.BoolVar(&f.daemon, "daemon", false, "detach: run in the background and return once the mount is up")
	set.StringVar(&f.logFile, "log-file", "", "append the log to this file (default stderr; /dev/null with --daemon)")
	f.log.register(set)
}

func runMount(args []string, stdout, stderr io.Writer) (err error) {
	// The daemon's threads spend their time blocked in system calls (go-fuse's
	// readers of /dev/fuse, softnic's recvmsg); with GOMAXPROCS = vCPUs every P
	// is often parked in one and each wake-up needs sysmon or a spare thread.
	// 8 measured fewer context switches per FUSE pread across a veth (4.8
	// vs 5.2-5.9 on 2 vCPUs); an explicit GOMAXPROCS in the environment wins.
	if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) < 8 {
		runtime.GOMAXPROCS(8)
	}
	var f mountFlags
	orig := append([]string(nil), args...)
	// A daemon child reports how the mount went to its parent.
	ready := daemonChild()
	if ready != nil {
		defer func() { ready.done(err) }()
	}
	set := flag.NewFlagSet("krfs mount", flag.ContinueOnError)
	set.SetOutput(stderr)
	f.register(set)
	set.Usage = func() {
		fmt.Fprintln(stderr, "usage: krfs mount MOUNTPOINT [flags]")
		set.PrintDefaults()
	}
	// Accept the mountpoint before or after the flags.
	pos, err := parseInterleaved(set, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		set.Usage()
		return fmt.Errorf("%w: one MOUNTPOINT expected, got %d", errUsage, len(pos))
	}
	if isMountHelper() {
		f.daemon = true // mount(8) waits for its helper to exit
	}
	if f.daemon && ready == nil {
		return daemonize(orig, &f, stdout)
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
	mem, err := parseSize(f.memSize)
	if err != nil {
		return err
	}
	if mem < 8 || mem > shm.MaxSize {
		return fmt.Errorf("%w: --mem-size %s: want 8 bytes to 1T", errUsage, f.memSize)
	}
	if err := shm.CheckFits(storeDir(f.shmDir, uint32(f.gid)), mem); err != nil {
		return fmt.Errorf("--mem-size %s: %w", f.memSize, err)
	}
	if f.gid > 1<<24 {
		return fmt.Errorf("%w: --gid %d: want 1..%d", errUsage, f.gid, 1<<24)
	}
	listen, err := netip.ParseAddrPort(f.listen)
	if err != nil || listen.Addr().IsUnspecified() {
		return fmt.Errorf("%w: --listen %q: want a specific IP:PORT that peers can reach", errUsage, f.listen)
	}
	servers, err := node.ParseMeta(f.meta)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := checkFUSE(); err != nil {
		return err
	}
	mnt := pos[0]
	cleaned, err := checkMountpoint(mnt)
	if err != nil {
		return err
	}
	if cleaned {
		log.Warnf("cleaned up a stale mount at %s left by a crashed daemon", mnt)
	}

	n, err := startNode(log, &f, listen, servers, mem)
	if err != nil {
		return err
	}
	defer n.Close()

	var backend fs.Backend = n
	if f.metricsAddr != "" {
		ops := node.NewOpMetrics()
		_, stop, err := node.ServeMetrics(log, f.metricsAddr, node.Registry(n, ops))
		if err != nil {
			return fmt.Errorf("--metrics-addr %s: %w", f.metricsAddr, err)
		}
		defer stop()
		backend = node.Metered(n, ops)
	}

	srv, err := fs.Mount(mnt, backend, fs.Options{AllowOther: f.allowOther, DefaultPermissions: f.defaultPerm,
		Timeout: f.timeout + time.Second, Debug: f.debugFUSE, Logf: log.Warnf})
	if err != nil {
		return fmt.Errorf("mount %s: %w", mnt, err)
	}
	log.WithFields(logrus.Fields{"mountpoint": mnt, "gid": n.Core().GID(), "address": n.Device().Addr(),
		"meta": n.MetaDesc()}).Info("krfs mounted")
	// Catch signals before telling anyone the mount is up: a stop request
	// right after READY=1 must unmount, not kill the daemon.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	notifyReady()
	if ready != nil {
		ready.done(nil)
	}

	served := make(chan struct{})
	go func() { srv.Wait(); close(served) }()
	select {
	case s := <-sigs:
		log.Infof("%v: unmounting %s", s, mnt)
	case <-served:
		log.Infof("%s was unmounted", mnt)
	}
	if err := srv.Unmount(); err != nil {
		log.Warnf("unmount %s: %v; detaching it", mnt, err)
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
	}
	return nil
}

// startNode opens the NIC on listen and starts a node on it as the mount
// flags say.
func startNode(log *logrus.Logger, f *mountFlags, listen netip.AddrPort, servers []netip.AddrPort, mem int64) (*node.Node, error) {
	key, err := readClusterKey(f.keyFile)
	if err != nil {
		return nil, err
	}
	dev, err := softnic.OpenUDPKey(listen.String(), key)
	if err != nil {
		if errors.Is(err, unix.EADDRINUSE) {
			return nil, fmt.Errorf("--listen %v is in use (another krfs node?): %w", listen, err)
		}
		return nil, fmt.Errorf("opening the NIC on %v: %w", listen, err)
	}
	return node.Start(context.Background(), node.Config{
		Device:  dev,
		Meta:    servers,
		QPCore:  qpcore.Config{GID: uint32(f.gid), DCIs: f.dcis, RCCap: f.rcCap, PeerTimeout: f.timeout},
		MemSize: mem,
		ShmDir:  f.shmDir,
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

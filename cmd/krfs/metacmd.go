package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/nic"
)

// metaFlags are the flags of `krfs meta`.
type metaFlags struct {
	listen, keyFile, backend string
	auth                     meta.AuthConfig // --max-nodes-per-source, --register-rate, --register-burst, --require-node-keys
	rdma                     rdmaFlags
	qos                      qosFlags
	log                      logFlags
}

// The per-source limits of krfs meta: a source IP (a host, or every node
// behind one NAT) may hold 4096 live entries and register 2048 times at
// once, then 200 times a second - room for a host of a thousand nodes
// starting together (two registrations each), none for a flood.
const (
	DefaultMaxNodesPerSource = 4096
	DefaultRegisterRate      = 200
	DefaultRegisterBurst     = 2048
)

// defaultMetaListen is `krfs meta`'s softnic --listen when none is given.
const defaultMetaListen = "127.0.0.1:4790"

// runMeta is `krfs meta --listen ADDR`: a standalone meta service.
func metaCmd(stderr io.Writer) *cobra.Command {
	f := &metaFlags{}
	cmd := &cobra.Command{
		Use:   "meta [--listen ADDR]",
		Short: "Run a standalone meta service (stays in the foreground)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(*cobra.Command, []string) error {
			return runMeta(f, stderr)
		},
	}
	set := cmd.Flags()
	set.StringVar(&f.listen, "listen", "", "address of the meta service's NIC: softnic's (default "+defaultMetaListen+"), or the rdma backend's connection manager (default: the GID's IP, port 4792)")
	set.StringVar(&f.keyFile, "cluster-key-file", "", "file holding the cluster secret: every packet is authenticated with it (softnic)")
	set.StringVar(&f.backend, "backend", "auto", "verbs backend: auto (an RNIC if a usable one exists, else softnic), softnic or rdma, as krfs mount; the nodes must use the same")
	set.IntVar(&f.auth.MaxNodesPerSource, "max-nodes-per-source", DefaultMaxNodesPerSource, "most live entries one source IP may register (0: no limit)")
	set.Float64Var(&f.auth.RegisterRate, "register-rate", DefaultRegisterRate, "registrations per second one source IP may make on average (0: no limit)")
	set.IntVar(&f.auth.RegisterBurst, "register-burst", DefaultRegisterBurst, "registrations one source IP may make at once")
	set.BoolVar(&f.auth.RequireNodeKeys, "require-node-keys", false, "refuse nodes that do not prove a node key (nodes of older releases)")
	f.rdma.register(set)
	f.qos.register(set)
	f.log.register(set)
	return cmd
}

func runMeta(f *metaFlags, stderr io.Writer) error {
	log, err := f.log.logger(stderr)
	if err != nil {
		return err
	}
	if f.listen != "" {
		if ap, err := netip.ParseAddrPort(f.listen); err != nil || ap.Addr().IsUnspecified() {
			return fmt.Errorf("%w: --listen %q: want a specific IP:PORT", errUsage, f.listen)
		}
	}
	backend, err := nic.ParseBackend(f.backend)
	if err != nil {
		return fmt.Errorf("%w: --backend: %v", errUsage, err)
	}
	switch {
	case f.auth.MaxNodesPerSource < 0:
		return fmt.Errorf("%w: --max-nodes-per-source %d: want 0 (no limit) or more", errUsage, f.auth.MaxNodesPerSource)
	case f.auth.RegisterRate < 0 || f.auth.RegisterRate != f.auth.RegisterRate:
		return fmt.Errorf("%w: --register-rate %v: want 0 (no limit) or more", errUsage, f.auth.RegisterRate)
	case f.auth.RegisterBurst < 1 && f.auth.RegisterRate > 0:
		return fmt.Errorf("%w: --register-burst %d: want at least 1", errUsage, f.auth.RegisterBurst)
	}
	key, err := readClusterKey(f.keyFile)
	if err != nil {
		return err
	}
	no := nic.Options{Backend: backend, Listen: f.listen, DefaultListen: defaultMetaListen, ClusterKey: key}
	f.rdma.apply(&no)
	f.qos.apply(&no)
	opened, err := nic.Open(no)
	if err != nil {
		if errors.Is(err, unix.EADDRINUSE) {
			return fmt.Errorf("--listen %v is in use: %w", f.listen, err)
		}
		return fmt.Errorf("opening the NIC (--backend %s): %w", backend, err)
	}
	dev := opened.Dev
	defer dev.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.Infof("NIC: %s", opened.Reason)
	log.Infof("meta service on %v", dev.Addr())
	// Without DC the service runs no DCT: clients READ the table over
	// their RC connection.
	err = meta.Serve(ctx, dev, meta.ServerConfig{NoDC: !opened.DC, Auth: f.auth})
	log.Info("meta service stopped")
	return err
}

// readClusterKey reads --cluster-key-file: at least 16 bytes of secret
// (surrounding white space ignored), in a file others cannot read.
func readClusterKey(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--cluster-key-file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("--cluster-key-file %s: mode %v lets others read the cluster key; chmod 600 it", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--cluster-key-file: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < 16 {
		return nil, fmt.Errorf("%w: --cluster-key-file %s: the key must be at least 16 bytes", errUsage, path)
	}
	return b, nil
}

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
	"github.com/krfs/krfs/verbs/softnic"
)

// runMeta is `krfs meta --listen ADDR`: a standalone meta service.
func metaCmd(stderr io.Writer) *cobra.Command {
	var listen, keyFile string
	var lf logFlags
	cmd := &cobra.Command{
		Use:   "meta [--listen ADDR]",
		Short: "Run a standalone meta service (stays in the foreground)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(*cobra.Command, []string) error {
			return runMeta(&listen, &keyFile, &lf, stderr)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:4790", "address of the meta service's software NIC")
	cmd.Flags().StringVar(&keyFile, "cluster-key-file", "", "file holding the cluster secret: every packet is authenticated with it")
	lf.register(cmd.Flags())
	return cmd
}

func runMeta(listen, keyFile *string, lf *logFlags, stderr io.Writer) error {
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	ap, err := netip.ParseAddrPort(*listen)
	if err != nil || ap.Addr().IsUnspecified() {
		return fmt.Errorf("%w: --listen %q: want a specific IP:PORT", errUsage, *listen)
	}
	key, err := readClusterKey(*keyFile)
	if err != nil {
		return err
	}
	dev, err := softnic.OpenUDPKey(ap.String(), key)
	if err != nil {
		if errors.Is(err, unix.EADDRINUSE) {
			return fmt.Errorf("--listen %v is in use: %w", ap, err)
		}
		return err
	}
	defer dev.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.Infof("meta service on %v", dev.Addr())
	err = meta.Serve(ctx, dev, meta.ServerConfig{})
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

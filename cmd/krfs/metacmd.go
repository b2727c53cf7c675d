package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/verbs/softnic"
)

// runMeta is `krfs meta --listen ADDR`: a standalone meta service.
func runMeta(args []string, stdout, stderr io.Writer) error {
	set := flag.NewFlagSet("krfs meta", flag.ContinueOnError)
	set.SetOutput(stderr)
	listen := set.String("listen", "127.0.0.1:4790", "address of the meta service's software NIC")
	var lf logFlags
	lf.register(set)
	if err := set.Parse(args); err != nil {
		return err
	}
	if set.NArg() != 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, set.Args())
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	ap, err := netip.ParseAddrPort(*listen)
	if err != nil || ap.Addr().IsUnspecified() {
		return fmt.Errorf("%w: --listen %q: want a specific IP:PORT", errUsage, *listen)
	}
	dev, err := softnic.OpenUDP(ap.String())
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

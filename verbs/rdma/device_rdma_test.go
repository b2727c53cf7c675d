//go:build rdma && linux && cgo

package rdma

import (
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/verbstest"
)

// hardware returns the configuration of the RNIC port to test on, or
// skips the test saying why. KRFS_RDMA_DEVICE, KRFS_RDMA_PORT and
// KRFS_RDMA_GID_INDEX pick one; by default the first usable port.
func hardware(t *testing.T) Config {
	devs, err := Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	// Port 0: every device of the suite opens the same RNIC port, each
	// with a connection manager of its own.
	cfg := Config{Device: os.Getenv("KRFS_RDMA_DEVICE"), GIDIndex: -1, CMAddr: ":0"}
	if p := os.Getenv("KRFS_RDMA_PORT"); p != "" {
		cfg.Port, _ = strconv.Atoi(p)
	}
	if g := os.Getenv("KRFS_RDMA_GID_INDEX"); g != "" {
		cfg.GIDIndex, _ = strconv.Atoi(g)
	}
	for _, d := range devs {
		for _, p := range d.Ports {
			if p.Usable() && (cfg.Device == "" || cfg.Device == d.Name) {
				return cfg
			}
		}
	}
	t.Skipf("SKIP: no RDMA device with a usable port on this machine (libibverbs lists %d devices); "+
		"this test runs the verbs conformance suite on real RNICs and did not run here", len(devs))
	return cfg
}

func TestDevicesListsWithoutError(t *testing.T) {
	devs, err := Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	t.Logf("libibverbs lists %d RDMA devices", len(devs))
	if len(devs) == 0 {
		start := time.Now()
		_, err := Open(Config{GIDIndex: -1})
		if !errors.Is(err, ErrNoDevice) {
			t.Fatalf("Open without devices: %v, want ErrNoDevice", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("Open without devices took %v", d)
		}
	}
}

func TestConformanceHardware(t *testing.T) {
	cfg := hardware(t)
	first, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open(%+v): %v", cfg, err)
	}
	caps := first.Caps()
	first.Close()
	t.Logf("testing on %s port %d (%s, gid %v, DC %v %s, atomics %v)", caps.Name, caps.Port, caps.LinkLayer, caps.GID, caps.DC, caps.DCNote, caps.Atomic)
	verbstest.Run(t, verbstest.Fabric{
		NewDevice: func(t testing.TB) verbs.Device {
			d, err := Open(cfg)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			t.Cleanup(func() { d.Close() })
			return d
		},
		NoDC:             !caps.DC,
		InexactReasons:   true,
		DCTSourceUnknown: true,
	})
}

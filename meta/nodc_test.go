package meta

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/krfs/krfs/verbs"
)

// rcOnlyDevice is a device without the DC transport, as an RNIC other
// than mlx5 is: creating a DCI or a DCT fails.
type rcOnlyDevice struct{ verbs.Device }

func (d rcOnlyDevice) AllocPD() (verbs.PD, error) {
	pd, err := d.Device.AllocPD()
	return rcOnlyPD{pd}, err
}

type rcOnlyPD struct{ verbs.PD }

var errNoDC = errors.New("test device has no DC transport")

func (p rcOnlyPD) CreateQP(cfg verbs.QPConfig) (verbs.QP, error) {
	if cfg.Type == verbs.DCI || cfg.Type == verbs.DCT {
		return nil, errNoDC
	}
	return p.PD.CreateQP(cfg)
}

// A meta server on a device without DC runs with NoDC: no DCT, DCT number
// 0 in the bootstrap, and clients register and look up over RC. Without
// NoDC it fails and says how to run.
func TestServerWithoutDC(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	dev := rcOnlyDevice{f.device()}
	if s, err := NewServer(dev, ServerConfig{}); err == nil || !errors.Is(err, errNoDC) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("NewServer on a device without DC = %v, want its DCT error", err)
	}
	s, err := NewServer(dev, ServerConfig{NoDC: true})
	if err != nil {
		t.Fatalf("NewServer with NoDC: %v", err)
	}
	defer s.Close()
	if b := s.Bootstrap(); b.DCTN != 0 || b.DCKey != 0 {
		t.Fatalf("bootstrap without DC names DCT %d key %#x", b.DCTN, b.DCKey)
	}
	c := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{s.Addr()}})
	ctx := ctxT(t)
	n := testNode(7, 0x77)
	a, err := c.Register(ctx, n, AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	got, err := c.Lookup(ctx, 7)
	if err != nil || !consistent(got) {
		t.Fatalf("Lookup through a server without DC = %+v, %v", got, err)
	}
}

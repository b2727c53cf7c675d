// Package fusetest decides whether a test that mounts a FUSE file system
// can run here.
//
// Call Require first thing in such a test:
//
//	func TestMount(t *testing.T) {
//		fusetest.Require(t)
//		...
//	}
//
// It skips the test when the process is not root or /dev/fuse is missing,
// unless KRFS_E2E=required says that the environment must have them (as
// CI does), in which case the test fails instead of passing unnoticed.
// Mount does that, then mounts a krfs tree for the length of the test.
package fusetest

import (
	"os"
	"testing"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/fs/fuseserve"
)

// Require skips (or, with KRFS_E2E=required, fails) t unless it can mount
// FUSE file systems.
func Require(t testing.TB) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "not root"
	} else if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "no /dev/fuse"
	}
	if why == "" {
		return
	}
	if os.Getenv("KRFS_E2E") == "required" {
		t.Fatalf("FUSE required (KRFS_E2E=required) but %s", why)
	}
	t.Skipf("FUSE unavailable: %s", why)
}

// RequireURing requires FUSE (see Require) and FUSE over io_uring: the
// test is skipped when the kernel has none; with KRFS_E2E=required it
// fails when the kernel has it but it is off (CI turns it on).
func RequireURing(t testing.TB) {
	t.Helper()
	Require(t)
	if ok, why := fuseserve.KernelOffersURing(); !ok {
		if _, err := os.Stat("/sys/module/fuse/parameters/enable_uring"); err == nil && os.Getenv("KRFS_E2E") == "required" {
			t.Fatalf("FUSE over io_uring required (KRFS_E2E=required) but %s", why)
		}
		t.Skipf("no FUSE over io_uring: %s", why)
	}
}

// Transport is the FUSE transport tests mount with: KRFS_FUSE_TRANSPORT
// (auto, uring or dev; default auto, as krfs mount), so that CI runs the FUSE tests on
// each.
func Transport() string {
	if v := os.Getenv("KRFS_FUSE_TRANSPORT"); v != "" {
		return v
	}
	return fs.TransportAuto
}

// Options returns o with its Transport set from KRFS_FUSE_TRANSPORT
// unless o names one.
func Options(o fs.Options) fs.Options {
	if o.Transport == "" {
		o.Transport = Transport()
	}
	return o
}

// Mount requires FUSE (see Require), mounts b's tree with options o in a
// temporary directory, and unmounts it when t ends (an unmount error fails
// t). It returns the mount point. Unless o names a transport, it is
// Transport's.
func Mount(t testing.TB, b fs.Backend, o fs.Options) string {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	srv, err := fs.Mount(dir, b, Options(o))
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	if o := Options(o); o.Transport == fs.TransportURing {
		if st := srv.Stats(); st.Transport != "io_uring" {
			t.Fatalf("--fuse-transport uring mounted over %s", st.Transport)
		}
	}
	t.Cleanup(func() {
		t.Logf("FUSE: %+v", srv.Stats())
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return dir
}

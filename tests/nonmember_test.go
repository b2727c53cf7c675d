package tests

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// nonMember attaches a host that is not a cluster member to the cluster's
// bridge: a namespace named PREFIX-suffix with eth0 at addr/24, removed
// when the test ends. Attack tests send their forged or replayed traffic
// from it. It returns the namespace's name.
func (c *cluster) nonMember(t *testing.T, suffix, addr string) string {
	t.Helper()
	ns := c.prefix()
	x := ns + "-" + suffix
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
	}
	run("ip", "netns", "add", x)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", x).Run() })
	run("ip", "-n", ns+"-sw", "link", "add", "v-"+suffix, "type", "veth", "peer", "name", "eth0", "netns", x)
	run("ip", "-n", ns+"-sw", "link", "set", "v-"+suffix, "master", "br0", "up")
	run("ip", "-n", x, "addr", "add", addr+"/24", "dev", "eth0")
	run("ip", "-n", x, "link", "set", "eth0", "up")
	return x
}

// prefix is the cluster's namespace prefix (its hosts are PREFIX-h1...,
// its bridge PREFIX-sw), as env gives it to scripts/cluster.sh.
func (c *cluster) prefix() string { return fmt.Sprintf("ke%d", os.Getpid()%100000) }

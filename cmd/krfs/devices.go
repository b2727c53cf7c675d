package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/krfs/krfs/verbs/rdma"
)

// runDevices is `krfs devices [-j]`: the RDMA devices this machine has,
// their ports, GIDs and DC capability, as libibverbs reports them.
func runDevices(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("devices", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("j", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: devices takes no arguments", errUsage)
	}
	devs, err := rdma.Devices()
	switch {
	case !rdma.Built:
		if *asJSON {
			return json.NewEncoder(stdout).Encode(map[string]any{"rdma_support": false, "devices": []rdma.DeviceInfo{}})
		}
		fmt.Fprintln(stdout, "RDMA devices: unknown: this krfs was built without RDMA support (go build -tags rdma, needs libibverbs-dev).")
		fmt.Fprintln(stdout, "krfs mount uses softnic, its software RDMA NIC over UDP.")
		return nil
	case err != nil:
		return err
	}
	if *asJSON {
		if devs == nil {
			devs = []rdma.DeviceInfo{}
		}
		return json.NewEncoder(stdout).Encode(map[string]any{"rdma_support": true, "devices": devs})
	}
	if len(devs) == 0 {
		fmt.Fprintln(stdout, "RDMA devices: none (libibverbs lists no device: no RNIC, or no kernel RDMA driver).")
		fmt.Fprintln(stdout, "krfs mount --backend auto uses softnic, its software RDMA NIC over UDP.")
		return nil
	}
	fmt.Fprint(stdout, rdma.Describe(devs))
	return nil
}

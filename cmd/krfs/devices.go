package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/krfs/krfs/verbs/rdma"
)

// runDevices is `krfs devices [-j]`: the RDMA devices this machine has,
// their ports, GIDs and DC capability, as libibverbs reports them.
func devicesCmd(stdout io.Writer) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "devices [-j]",
		Short: "List RDMA devices (RNICs), their ports, GIDs and DC capability",
		Args:  exactArgs(0, "no arguments"),
		RunE:  func(*cobra.Command, []string) error { return runDevices(asJSON, stdout) },
	}
	cmd.Flags().BoolVarP(&asJSON, "json", "j", false, "print JSON")
	return cmd
}

func runDevices(asJSON bool, stdout io.Writer) error {
	devs, err := rdma.Devices()
	switch {
	case !rdma.Built:
		if asJSON {
			return json.NewEncoder(stdout).Encode(map[string]any{"rdma_support": false, "devices": []rdma.DeviceInfo{}})
		}
		fmt.Fprintln(stdout, "RDMA devices: unknown: this krfs was built without RDMA support (go build -tags rdma, needs libibverbs-dev).")
		fmt.Fprintln(stdout, "krfs mount uses softnic, its software RDMA NIC over UDP.")
		return nil
	case err != nil:
		return err
	}
	if asJSON {
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
	if plan, err := rdma.Plan(devs, rdma.Config{GIDIndex: -1}); err == nil {
		fmt.Fprintf(stdout, "krfs mount --backend rdma would use: %s\n", plan)
	} else {
		fmt.Fprintf(stdout, "krfs mount --backend rdma would fail: %v\n", err)
	}
	return nil
}

package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/krfs/krfs/verbs/rdma"
)

func TestDevicesSaysWhatThisMachineHas(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"krfs", "devices"}, &out, &errb); code != 0 {
		t.Fatalf("krfs devices exited %d: %s", code, errb.String())
	}
	devs, _ := rdma.Devices()
	switch {
	case !rdma.Built:
		if !strings.Contains(out.String(), "built without RDMA support") || !strings.Contains(out.String(), "softnic") {
			t.Fatalf("output does not say the build lacks RDMA:\n%s", out.String())
		}
	case len(devs) == 0:
		if !strings.Contains(out.String(), "RDMA devices: none") {
			t.Fatalf("output does not say there is no RDMA device:\n%s", out.String())
		}
	default:
		for _, d := range devs {
			if !strings.Contains(out.String(), d.Name) {
				t.Fatalf("output lacks device %s:\n%s", d.Name, out.String())
			}
		}
	}
	out.Reset()
	if code := run([]string{"krfs", "devices", "-j"}, &out, &errb); code != 0 {
		t.Fatalf("krfs devices -j exited %d", code)
	}
	var j struct {
		RDMASupport bool              `json:"rdma_support"`
		Devices     []rdma.DeviceInfo `json:"devices"`
	}
	if err := json.Unmarshal(out.Bytes(), &j); err != nil || j.RDMASupport != rdma.Built || len(j.Devices) != len(devs) {
		t.Fatalf("JSON %q: %+v, %v", out.String(), j, err)
	}
	if code := run([]string{"krfs", "devices", "extra"}, &out, &errb); code != 2 {
		t.Fatalf("krfs devices extra exited %d, want 2", code)
	}
}

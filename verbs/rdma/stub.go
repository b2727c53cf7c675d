//go:build !rdma || !linux || !cgo

package rdma

import (
	"github.com/krfs/krfs/verbs"
)

// Built reports whether this binary has the libibverbs backend.
const Built = false

// Devices fails with ErrNotBuilt: this binary has no libibverbs backend.
func Devices() ([]DeviceInfo, error) { return nil, ErrNotBuilt }

// Open fails with ErrNotBuilt: this binary has no libibverbs backend.
func Open(Config) (*Device, error) { return nil, ErrNotBuilt }

// Device exists in builds without the rdma tag only so that code naming
// it compiles; no value of it can be opened.
type Device struct{ verbs.Device }

// Caps is empty: no device can be opened in this build.
func (*Device) Caps() Caps { return Caps{} }

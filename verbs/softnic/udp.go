package softnic

import (
	"github.com/krfs/krfs/verbs/softnic/udplink"
)

// OpenUDP opens a device on a real UDP socket bound to addr ("host:port",
// port 0 picks one), with GSO and GRO, the system clock and the default
// path MTU.
func OpenUDP(addr string) (*Device, error) {
	l, err := udplink.Open(udplink.DefaultConfig(addr))
	if err != nil {
		return nil, err
	}
	d, err := Open(Config{Link: l})
	if err != nil {
		l.Close()
		return nil, err
	}
	return d, nil
}

package softnic

import (
	"github.com/krfs/krfs/verbs/softnic/udplink"
)

// OpenUDP opens a device on a real UDP socket bound to addr ("host:port",
// port 0 picks one), with GSO and GRO, the system clock and the default
// path MTU.
func OpenUDP(addr string) (*Device, error) { return OpenUDPKey(addr, nil) }

// OpenUDPKey is OpenUDP with a cluster key: when key is not empty every
// packet the device sends carries a keyed MAC, and every packet it
// receives must carry a valid one (see Config.ClusterKey).
func OpenUDPKey(addr string, key []byte) (*Device, error) { return OpenUDPAuth(addr, key, false) }

// OpenUDPAuth is OpenUDPKey that can also encrypt payloads (see
// Config.Encrypt; encrypt needs a key).
func OpenUDPAuth(addr string, key []byte, encrypt bool) (*Device, error) {
	l, err := udplink.Open(udplink.DefaultConfig(addr))
	if err != nil {
		return nil, err
	}
	d, err := Open(Config{Link: l, ClusterKey: key, Encrypt: encrypt})
	if err != nil {
		l.Close()
		return nil, err
	}
	return d, nil
}

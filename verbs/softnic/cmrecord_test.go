package softnic

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/wire"
)

// TestCMRecordsExpireInOrder: the passive side's handshake records expire
// cmRecordTL after they were made, whatever was confirmed (CM_RTU) or
// answered again in between, and the list that orders them stays within
// a small multiple of the records held.
func TestCMRecordsExpireInOrder(t *testing.T) {
	var c cmState
	c.init()
	t0 := time.Unix(1000, 0)
	key := func(i int) cmKey {
		return cmKey{netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 4791), uint64(i)}
	}
	const n = 20000
	for i := range n {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		c.expireLocked(now)
		c.addLocked(key(i), &cmRecord{rep: wire.Header{ConnID: uint64(i)}, at: now})
		switch {
		case i >= 10 && i%3 == 0:
			c.dropLocked(key(i - 10)) // confirmed
		case i%7 == 0 && i >= 20:
			// answered again (a repeated request): a new record
			if _, ok := c.done[key(i-20)]; ok {
				c.addLocked(key(i-20), &cmRecord{at: now})
			}
		}
		if len(c.aged)-c.agedHead > 2*len(c.done)+64 || c.agedHead > len(c.aged) {
			t.Fatalf("after %d records: %d listed from %d for %d held", i+1, len(c.aged), c.agedHead, len(c.done))
		}
	}
	end := t0.Add((n - 1) * time.Millisecond)
	c.expireLocked(end)
	// What is left: exactly the records made within cmRecordTL of end.
	for k, r := range c.done {
		if end.Sub(r.at) > cmRecordTL {
			t.Fatalf("record %v made %v before the last expiry still held", k, end.Sub(r.at))
		}
	}
	want := 0
	for i := range n {
		confirmed := i+10 < n && (i+10)%3 == 0 // dropped when record i+10 was made
		at := i
		if j := i + 20; !confirmed && j < n && j%7 == 0 && j%3 != 0 {
			at = j // answered again
		}
		held := !confirmed && end.Sub(t0.Add(time.Duration(at)*time.Millisecond)) <= cmRecordTL
		if r, ok := c.done[key(i)]; ok != held || ok && !r.at.Equal(t0.Add(time.Duration(at)*time.Millisecond)) {
			t.Fatalf("record %d: held %v, want %v", i, ok, held)
		}
		if held {
			want++
		}
	}
	srcs := 0
	for _, v := range c.perSrc {
		srcs += v
	}
	if srcs != want || len(c.done) != want {
		t.Fatalf("%d records, %d counted per source, want %d", len(c.done), srcs, want)
	}
	c.expireLocked(end.Add(cmRecordTL + time.Millisecond))
	if len(c.done) != 0 || len(c.perSrc) != 0 || len(c.aged) != 0 {
		t.Fatalf("after every record's lifetime: %d records, %d sources, %d listed", len(c.done), len(c.perSrc), len(c.aged))
	}
}

// TestCMCookieReusedMAC: cookies made with the reused HMACs, from several
// goroutines at once, are those of a fresh HMAC of the address, the
// connection ID and the epoch.
func TestCMCookieReusedMAC(t *testing.T) {
	var c cmState
	c.init()
	want := func(from netip.AddrPort, id uint64, e int64) uint64 {
		m := hmac.New(sha256.New, c.secret[:])
		b, _ := from.MarshalBinary()
		m.Write(b)
		var x [16]byte
		binary.BigEndian.PutUint64(x[:], id)
		binary.BigEndian.PutUint64(x[8:], uint64(e))
		m.Write(x[:])
		return binary.BigEndian.Uint64(m.Sum(nil)) | 1
	}
	froms := []netip.AddrPort{
		netip.MustParseAddrPort("10.1.2.3:4791"),
		netip.MustParseAddrPort("[fe80::1%eth0]:4791"),
		netip.MustParseAddrPort("[2001:db8::7]:20000"),
	}
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				from, id, e := froms[i%len(froms)], uint64(i*7+g), int64(i%3)
				if got, w := c.cookie(from, id, e), want(from, id, e); got != w {
					errs <- fmt.Sprintf("cookie(%v, %d, %d) = %x, want %x", from, id, e, got, w)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

package units

import "testing"

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "64K": 64 << 10, "16M": 16 << 20, "1G": 1 << 30,
		"2GiB": 2 << 30, "1t": 1 << 40, "0": 0, " 8m ": 8 << 20, "512B": 512} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "M", "-1", "1X", "2T", "1.5G", "1099511627777"} {
		if got, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", bad, got)
		}
	}
}

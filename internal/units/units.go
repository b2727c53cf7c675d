// Package units parses the byte sizes krfs's command line takes: 4096,
// 64K, 16M, 1G, 1T (powers of 1024; a trailing B or iB is allowed, case
// does not matter), at most 1 TiB.
package units

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxBytes is the largest size ParseBytes accepts.
const MaxBytes = 1 << 40

// ParseBytes parses a size like 4096, 64K, 16M or 1G.
func ParseBytes(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mul := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mul, t = 1<<10, t[:n-1]
		case 'M':
			mul, t = 1<<20, t[:n-1]
		case 'G':
			mul, t = 1<<30, t[:n-1]
		case 'T':
			mul, t = 1<<40, t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 || v > MaxBytes/mul {
		return 0, fmt.Errorf("size %q: want a number with an optional K, M, G or T suffix, at most 1T", s)
	}
	return v * mul, nil
}

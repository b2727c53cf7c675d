package meta

import (
	"errors"
	"strings"
	"testing"
)

// unreachable says "unreachable" once, always wraps ErrUnreachable, and
// is an error even with no server's error to join.
func TestUnreachableJoin(t *testing.T) {
	one := errors.Join(errors.New("x"))
	cases := []struct {
		errs []error
		want int // times ErrUnreachable's text appears
	}{
		{nil, 1},
		{[]error{wrapUnreachable("10.0.0.1:4791")}, 1},
		{[]error{wrapUnreachable("10.0.0.1:4791"), wrapUnreachable("10.0.0.2:4791")}, 2},
		{[]error{one}, 1},
	}
	for _, c := range cases {
		err := unreachable(c.errs)
		if err == nil || !errors.Is(err, ErrUnreachable) {
			t.Fatalf("unreachable(%v) = %v, want an ErrUnreachable", c.errs, err)
		}
		if n := strings.Count(err.Error(), ErrUnreachable.Error()); n != c.want {
			t.Errorf("unreachable(%v) = %q: says it %d times, want %d", c.errs, err, n, c.want)
		}
	}
}

func wrapUnreachable(addr string) error {
	return errors.Join(ErrUnreachable, errors.New(addr+": timed out"))
}

package segments

import (
	"fmt"
	"strconv"
	"strings"
)

// Place is where stock sits: the central pool or one segment.
//
// Places are ordered: the pool first, then segments by index. Code that holds
// several places' locks at once takes them in this order, so two such
// operations can never wait for each other in a cycle.
type Place int

// Pool is the central pool.
const Pool Place = -1

// Segment returns the place of segment i.
func Segment(i int) Place { return Place(i) }

// IsPool reports whether p is the central pool.
func (p Place) IsPool() bool { return p == Pool }

// Index is the segment index, or -1 for the pool.
func (p Place) Index() int { return int(p) }

// String returns "pool" or "seg/<i>".
func (p Place) String() string {
	if p.IsPool() {
		return "pool"
	}
	return "seg/" + strconv.Itoa(int(p))
}

// MarshalText encodes p as its String form.
func (p Place) MarshalText() ([]byte, error) {
	if p < Pool {
		return nil, fmt.Errorf("segments: invalid place %d", int(p))
	}
	return []byte(p.String()), nil
}

// UnmarshalText accepts exactly what MarshalText produces.
func (p *Place) UnmarshalText(b []byte) error {
	s := string(b)
	if s == "pool" {
		*p = Pool
		return nil
	}
	digits, ok := strings.CutPrefix(s, "seg/")
	if !ok || digits == "" || len(digits) > 4 || (len(digits) > 1 && digits[0] == '0') {
		return fmt.Errorf("segments: invalid place %q", s)
	}
	i, err := strconv.Atoi(digits)
	if err != nil || i < 0 || i >= MaxSegments {
		return fmt.Errorf("segments: invalid place %q", s)
	}
	*p = Place(i)
	return nil
}

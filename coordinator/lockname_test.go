package coordinator_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stockctl/stockctl/coordinator"
)

// A bad lock name's error names the character as the caller wrote it
// (issue 28, item 7: "byte 0 ('Î')" for the first byte of "Î", 0xc3,
// quoted as a character of its own).
func TestLockNameErrorQuotesUTF8(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"Îlot", `byte 0 (the first of 2 bytes of 'Î', U+00CE)`},
		{"job-€", `byte 4 (the first of 3 bytes of '€', U+20AC)`},
		{"a b", `byte 1 (' ')`},
		{"a/b", `byte 1 ('/')`},
		{"a\x00", `byte 1 ('\x00')`},
		{"\xffx", `byte 0 (0xff)`},
	} {
		err := coordinator.ValidateLockName(tc.name)
		if !errors.Is(err, coordinator.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.name, err, tc.want)
		}
	}
}

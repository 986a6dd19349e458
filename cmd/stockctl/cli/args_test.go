package cli

import (
	"slices"
	"strings"
	"testing"
)

func TestPermuteArgs(t *testing.T) {
	app := New()
	for _, tc := range []struct{ in, want string }{
		{"stockctl allocate iphone --qty 2 --order o1", "stockctl allocate --qty 2 --order o1 iphone"},
		{"stockctl -o json allocate iphone --qty=2 --order o1", "stockctl -o json allocate --qty=2 --order o1 iphone"},
		{"stockctl --endpoints http://x:1 status iphone", "stockctl --endpoints http://x:1 status iphone"},
		{"stockctl rebalance iphone --watch", "stockctl rebalance --watch iphone"},
		{"stockctl rebalance --watch iphone", "stockctl rebalance --watch iphone"},
		{"stockctl lock job --ttl 5s -- sh -c exit --ttl", "stockctl lock --ttl 5s job -- sh -c exit --ttl"},
		{"stockctl lock job -- sh", "stockctl lock job -- sh"},
		{"stockctl unknown a --b c", "stockctl unknown a --b c"},
		{"stockctl -o json", "stockctl -o json"},
		{"stockctl", "stockctl"},
	} {
		got := permuteArgs(app, strings.Fields(tc.in))
		if want := strings.Fields(tc.want); !slices.Equal(got, want) {
			t.Errorf("permuteArgs(%q) = %q, want %q", tc.in, got, want)
		}
	}
}

package bench

import (
	"fmt"

	"github.com/stockctl/stockctl/segments"
)

// maxRouteTries bounds the search for one buyer's route key, per segment:
// FNV-1a spreads keys evenly, so about n tries find one for any of n
// segments; a thousand times that is never reached in practice.
const maxRouteTries = 1000

// evenRouteKeys returns a route key per buyer such that buyer b routes to
// segment b mod n: every segment gets the same number of buyers (±1), as
// a crowd of many users hashing to segments would on average. Hashing a few
// buyers' own IDs instead leaves some segments with none and others with
// several, which measures the luck of the draw rather than the locks.
func evenRouteKeys(buyers, n int) ([]string, error) {
	keys := make([]string, buyers)
	for b := range keys {
		want := b % n
		found := false
		for i := range maxRouteTries * n {
			k := fmt.Sprintf("user-%d-%d", b, i)
			if segments.Route(k, n) == want {
				keys[b], found = k, true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("no route key found for buyer %d to segment %d of %d", b, want, n)
		}
	}
	return keys, nil
}

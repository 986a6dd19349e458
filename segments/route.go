package segments

import "hash/fnv"

// Route returns the segment a route key belongs to: FNV-1a (64-bit) of the
// key's bytes modulo n. It is stable across processes and versions. n must
// be at least 1.
func Route(key string, n int) int {
	if n < 1 {
		panic("segments: Route with n < 1")
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	return int(h.Sum64() % uint64(n))
}

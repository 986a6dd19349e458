package segments

import "slices"

// The fair-share policy, as pure functions of what a seller sees: which
// process holds or waits for each segment lock of the SKU (its view). The
// seller applies them (sellerview.go, grow.go); share_test.go checks them
// without etcd.

// fairShare is a process's share of n segments among m processes (m ≥ 1):
// lo = ⌊n/m⌋ and hi = ⌈n/m⌉.
func fairShare(n, m int) (lo, hi int) { return n / m, (n + m - 1) / m }

// shareOf is self's fair share of the view's segments, counting every
// process that holds or waits for one of them, and self.
func shareOf(view []map[string]lockKey, self int64) (lo, hi int) {
	members := map[int64]bool{self: true}
	for _, keys := range view {
		for _, k := range keys {
			members[k.lease] = true
		}
	}
	return fairShare(len(view), len(members))
}

// holderOf is the lease whose key is the oldest under a segment's lock: the
// holder (0 when the segment is free).
func holderOf(keys map[string]lockKey) int64 {
	first := lockKey{}
	for _, k := range keys {
		if first.rev == 0 || k.rev < first.rev {
			first = k
		}
	}
	return first.lease
}

// waitedFor reports whether another key than own (held under ownKey, at
// ownRev) waits behind it in a segment's keys.
func waitedFor(keys map[string]lockKey, ownKey string, ownRev int64) bool {
	for key, k := range keys {
		if k.rev > ownRev && key != ownKey {
			return true
		}
	}
	return false
}

// yieldAtOnce reports whether a held segment another process waits for is
// given back at once: when it is idle, or while this process holds more
// than lo = ⌊N/M⌋ (held counts what it still holds after the yields already
// decided). Otherwise it is kept for at most TenureMaxHold, so that no
// process waits longer than that (plus a step and a commit) for a segment.
func yieldAtOnce(idle bool, held, lo int) bool { return idle || held > lo }

// claimTarget picks the segment a process holding held segments queues
// for when no segment is free: only below max(lo, 1), a segment of the
// process holding the most, if it holds more than hi; with none held at
// all, of whichever process holds the most. owners maps each other
// process's lease to the segments it holds, in the order to try them. -1:
// none. Ties go to the lowest lease, so the choice is deterministic.
func claimTarget(owners map[int64][]int, held, lo, hi int) int {
	if held >= max(lo, 1) {
		return -1
	}
	leases := make([]int64, 0, len(owners))
	for l := range owners {
		leases = append(leases, l)
	}
	slices.Sort(leases)
	pick := func(over int) int {
		most, claim := over, -1
		for _, l := range leases {
			if segs := owners[l]; len(segs) > most {
				most, claim = len(segs), segs[0]
			}
		}
		return claim
	}
	if claim := pick(hi); claim >= 0 {
		return claim
	}
	if held == 0 {
		return pick(0) // none at all: anyone's will do
	}
	return -1
}

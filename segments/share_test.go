package segments

import (
	"fmt"
	"testing"
)

func TestFairShare(t *testing.T) {
	for _, tc := range []struct{ n, m, lo, hi int }{
		{20, 1, 20, 20}, {20, 4, 5, 5}, {20, 3, 6, 7}, {1, 2, 0, 1}, {3, 4, 0, 1}, {100, 7, 14, 15},
	} {
		if lo, hi := fairShare(tc.n, tc.m); lo != tc.lo || hi != tc.hi {
			t.Errorf("fairShare(%d, %d) = %d, %d; want %d, %d", tc.n, tc.m, lo, hi, tc.lo, tc.hi)
		}
	}
}

// view builds a seller's view: for each segment, the leases of its keys,
// oldest (the holder) first.
func view(segs ...[]int64) []map[string]lockKey {
	v := make([]map[string]lockKey, len(segs))
	rev := int64(1)
	for i, leases := range segs {
		v[i] = map[string]lockKey{}
		for _, l := range leases {
			v[i][fmt.Sprintf("seg/%d/%x", i, l)] = lockKey{rev: rev, lease: l}
			rev++
		}
	}
	return v
}

func TestShareOfCountsEveryProcessInTheView(t *testing.T) {
	// Four segments: self (1) holds one, process 2 holds two and waits for
	// a third behind process 3.
	v := view([]int64{1}, []int64{2}, []int64{2}, []int64{3, 2})
	if lo, hi := shareOf(v, 1); lo != 1 || hi != 2 {
		t.Errorf("shareOf = %d, %d; want 1, 2 (4 segments, 3 processes)", lo, hi)
	}
	// A process not yet in the view counts itself.
	if lo, hi := shareOf(v, 9); lo != 1 || hi != 1 {
		t.Errorf("shareOf(newcomer) = %d, %d; want 1, 1 (4 segments, 4 processes)", lo, hi)
	}
	if h := holderOf(v[3]); h != 3 {
		t.Errorf("holderOf = %d; want the oldest key's lease 3", h)
	}
	if h := holderOf(map[string]lockKey{}); h != 0 {
		t.Errorf("holderOf(free) = %d; want 0", h)
	}
}

func TestWaitedFor(t *testing.T) {
	v := view([]int64{1, 2})
	own := "seg/0/1"
	if !waitedFor(v[0], own, v[0][own].rev) {
		t.Error("a newer key of another process is a waiter")
	}
	if waitedFor(v[0], "seg/0/2", v[0]["seg/0/2"].rev) {
		t.Error("an older key is not waiting behind us")
	}
	if waitedFor(view([]int64{1})[0], own, 1) {
		t.Error("our own key alone is not a waiter")
	}
}

func TestYieldAtOnce(t *testing.T) {
	for _, tc := range []struct {
		idle     bool
		held, lo int
		want     bool
	}{
		{idle: true, held: 1, lo: 5, want: true},   // idle: nobody loses an order
		{idle: false, held: 6, lo: 5, want: true},  // over the share
		{idle: false, held: 5, lo: 5, want: false}, // at the share: kept for TenureMaxHold
		{idle: false, held: 1, lo: 0, want: true},  // fewer segments than processes
	} {
		if got := yieldAtOnce(tc.idle, tc.held, tc.lo); got != tc.want {
			t.Errorf("yieldAtOnce(%v, %d, %d) = %v; want %v", tc.idle, tc.held, tc.lo, got, tc.want)
		}
	}
}

func TestClaimTarget(t *testing.T) {
	for _, tc := range []struct {
		name         string
		owners       map[int64][]int
		held, lo, hi int
		want         int
	}{
		{"at or over max(lo, 1): no claim", map[int64][]int{7: {0, 1, 2, 3}}, 1, 1, 2, -1},
		{"below lo: the owner over hi", map[int64][]int{7: {4, 5, 6}, 8: {1, 2}}, 0, 2, 2, 4},
		{"below lo, nobody over hi: none while holding some", map[int64][]int{7: {4, 5}, 8: {1, 2}}, 1, 2, 2, -1},
		{"holding none: anyone's, the one holding the most", map[int64][]int{7: {4}, 8: {1, 2}}, 0, 0, 1, 1},
		{"ties go to the lowest lease", map[int64][]int{9: {6, 7, 8}, 3: {1, 2, 0}}, 0, 2, 2, 1},
		{"nobody to claim from", map[int64][]int{}, 0, 1, 1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := claimTarget(tc.owners, tc.held, tc.lo, tc.hi); got != tc.want {
				t.Errorf("claimTarget = %d; want %d", got, tc.want)
			}
		})
	}
}

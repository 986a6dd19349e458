package segments

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// fakeRungs records which dry rungs an order took and answers each as told.
type fakeRungs struct {
	found map[rung]bool
	err   map[rung]error
	taken []rung
}

func (f *fakeRungs) refreshInboxes(context.Context, int64) (bool, error) {
	f.taken = append(f.taken, rungInboxes)
	return f.found[rungInboxes], f.err[rungInboxes]
}

func (f *fakeRungs) pullFromPool(context.Context, int64, int) (bool, error) {
	f.taken = append(f.taken, rungPull)
	return f.found[rungPull], f.err[rungPull]
}

func (f *fakeRungs) grow(context.Context, int) bool {
	f.taken = append(f.taken, rungGrow)
	return f.found[rungGrow]
}

// The dry rungs are taken in order, each once per order; one that finds
// stock sends the order back up (again), and the next climb goes on below
// it; when all three found nothing the order goes on to the whole SKU.
func TestDryRungs(t *testing.T) {
	boom := errors.New("etcd down")
	for _, tc := range []struct {
		name   string
		found  map[rung]bool
		err    map[rung]error
		climbs int // climbs until the last result
		taken  []rung
		want   resultKind
	}{
		{name: "nothing anywhere", climbs: 1, taken: []rung{rungInboxes, rungPull, rungGrow}, want: resShort},
		{name: "inboxes hold it", found: map[rung]bool{rungInboxes: true}, climbs: 2,
			taken: []rung{rungInboxes, rungPull, rungGrow}, want: resShort},
		{name: "a pull and a grow both help, once each", found: map[rung]bool{rungPull: true, rungGrow: true}, climbs: 3,
			taken: []rung{rungInboxes, rungPull, rungGrow}, want: resShort},
		{name: "a failed read fails the order", err: map[rung]error{rungInboxes: boom}, climbs: 1,
			taken: []rung{rungInboxes}, want: resFailed},
		{name: "a failed pull fails the order", err: map[rung]error{rungPull: boom}, climbs: 1,
			taken: []rung{rungInboxes, rungPull}, want: resFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeRungs{found: tc.found, err: tc.err}
			var d dryRungs
			var r placeResult
			again := true
			climbs := 0
			for again {
				r, again = d.climb(t.Context(), f, 1, 0)
				climbs++
			}
			if climbs != tc.climbs || !slices.Equal(f.taken, tc.taken) || r.kind != tc.want {
				t.Errorf("%d climbs took %v and ended %v; want %d climbs, %v, %v", climbs, f.taken, r.kind, tc.climbs, tc.taken, tc.want)
			}
			if tc.want == resFailed && !errors.Is(r.err, boom) {
				t.Errorf("failure %v; want the rung's error", r.err)
			}
		})
	}
}

// Rungs 5 to 7 try the places that alone hold the quantity, the pool first
// and home last, and gather from places holding anything, in the global
// lock order.
func TestSnapshotPlaces(t *testing.T) {
	s := &snapshot{pool: 5, segs: []int64{3, 0, 9, 4}}
	if got, want := s.candidates(4, 2), []Place{Pool, Segment(3), Segment(2)}; !slices.Equal(got, want) {
		t.Errorf("candidates(4, home 2) = %v; want %v", got, want)
	}
	if got, want := s.candidates(6, 0), []Place{Segment(2)}; !slices.Equal(got, want) {
		t.Errorf("candidates(6, home 0) = %v; want %v", got, want)
	}
	if got, want := s.withStock(), []Place{Pool, Segment(0), Segment(2), Segment(3)}; !slices.Equal(got, want) {
		t.Errorf("withStock = %v; want %v", got, want)
	}
	if s.total() != 21 {
		t.Errorf("total = %d; want 21", s.total())
	}
}

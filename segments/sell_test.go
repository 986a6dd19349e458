package segments

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// fakeRungs records which dry rungs an order took and answers each as told.
type fakeRungs struct {
	snap  *snapshot
	final *placeResult // the look answers the order
	found map[rung]bool
	err   map[rung]error
	taken []rung
}

func (f *fakeRungs) lookAt(context.Context, *allocReq) (*snapshot, placeResult, bool) {
	f.taken = append(f.taken, rungLook)
	if f.final != nil {
		return f.snap, *f.final, true
	}
	return f.snap, placeResult{}, false
}

func (f *fakeRungs) heldCanGive(int64) bool { return f.found[rungLook] }

func (f *fakeRungs) directCanGive(*allocReq, int) bool { return false }

func (f *fakeRungs) pullFromPool(context.Context, *allocReq, int) (bool, error) {
	f.taken = append(f.taken, rungPull)
	return f.found[rungPull], f.err[rungPull]
}

func (f *fakeRungs) growInto(context.Context, int, *snapshot, int64) bool {
	f.taken = append(f.taken, rungGrow)
	return f.found[rungGrow]
}

// The dry rungs are taken in order, each once per order; one that finds
// stock sends the order back up (again), and the next climb goes on below
// it; a look that answers the order (a refusal) ends the climb at once,
// with no pull and no grow; the pull is skipped when the look saw an empty
// pool; when all three found nothing the order goes on with its look.
func TestDryRungs(t *testing.T) {
	boom := errors.New("etcd down")
	withPool := &snapshot{pool: 5, segs: []int64{0, 0}}
	noPool := &snapshot{pool: 0, segs: []int64{0, 3}}
	refusal := failed(&InsufficientStockError{SKU: "s", Want: 1})
	for _, tc := range []struct {
		name   string
		snap   *snapshot
		final  *placeResult
		found  map[rung]bool
		err    map[rung]error
		climbs int // climbs until the last result
		taken  []rung
		want   resultKind
	}{
		{name: "nothing anywhere", snap: withPool, climbs: 1, taken: []rung{rungLook, rungPull, rungGrow}, want: resShort},
		{name: "sold out: the look refuses, no pull, no grow", snap: noPool, final: &refusal, climbs: 1,
			taken: []rung{rungLook}, want: resFailed},
		{name: "an empty pool is not pulled from", snap: noPool, climbs: 1, taken: []rung{rungLook, rungGrow}, want: resShort},
		{name: "the inboxes hold it", snap: withPool, found: map[rung]bool{rungLook: true}, climbs: 2,
			taken: []rung{rungLook, rungPull, rungGrow}, want: resShort},
		{name: "a pull and a grow both help, once each", snap: withPool, found: map[rung]bool{rungPull: true, rungGrow: true}, climbs: 3,
			taken: []rung{rungLook, rungPull, rungGrow}, want: resShort},
		{name: "a failed pull fails the order", snap: withPool, err: map[rung]error{rungPull: boom}, climbs: 1,
			taken: []rung{rungLook, rungPull}, want: resFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeRungs{snap: tc.snap, final: tc.final, found: tc.found, err: tc.err}
			var d dryRungs
			var r placeResult
			again := true
			climbs := 0
			req := &allocReq{sku: &skuInfo{name: "s", segments: 2}, order: "o", qty: 1}
			for again {
				r, again = d.climb(t.Context(), f, req, 0)
				climbs++
			}
			if climbs != tc.climbs || !slices.Equal(f.taken, tc.taken) || r.kind != tc.want {
				t.Errorf("%d climbs took %v and ended %v; want %d climbs, %v, %v", climbs, f.taken, r.kind, tc.climbs, tc.taken, tc.want)
			}
			if r.kind == resShort && r.snap != tc.snap {
				t.Error("the order went on without its look")
			}
			if tc.err != nil && !errors.Is(r.err, boom) {
				t.Errorf("failure %v; want the rung's error", r.err)
			}
		})
	}
}

// Rungs 5 and 6 try the places that alone hold the quantity, the pool first
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

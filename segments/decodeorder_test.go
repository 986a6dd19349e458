package segments

import (
	"fmt"
	"testing"
	"time"
)

// sameTimes compares decoded times pairwise by instant and by how they
// print (their zones are distinct *Locations, which no == compares).
func sameTimes(pairs ...[2]time.Time) error {
	ts := func(t time.Time) string { return t.Format(time.RFC3339Nano) + "|" + fmt.Sprint(t.IsZero()) }
	for _, p := range pairs {
		if !p[0].Equal(p[1]) || ts(p[0]) != ts(p[1]) {
			return fmt.Errorf("times %s and %s", ts(p[0]), ts(p[1]))
		}
	}
	return nil
}

// sameOrder compares two decoded orders field by field, times by sameTimes.
func sameOrder(a, b Order) error {
	as, bs := a, b
	as.Created, as.Deadline, as.PrunedAt = time.Time{}, time.Time{}, time.Time{}
	bs.Created, bs.Deadline, bs.PrunedAt = time.Time{}, time.Time{}, time.Time{}
	if fmt.Sprintf("%#v", as) != fmt.Sprintf("%#v", bs) {
		return fmt.Errorf("%#v\n  against %#v", as, bs)
	}
	return sameTimes([2]time.Time{a.Created, b.Created}, [2]time.Time{a.Deadline, b.Deadline}, [2]time.Time{a.PrunedAt, b.PrunedAt})
}

// fuzzAgainstJSON fuzzes a fast decoder: every input it reads (ok) must be
// one encoding/json's strict decoder reads too, to the same value (same).
func fuzzAgainstJSON[T any](f *testing.F, fast func([]byte) (T, bool), same func(a, b T) error) {
	f.Fuzz(func(t *testing.T, value []byte) {
		got, ok := fast(value)
		if !ok {
			return
		}
		var slow T
		if err := strictJSON(value, &slow); err != nil {
			t.Fatalf("the fast path read %q, encoding/json refuses it: %v", value, err)
		}
		if err := same(got, slow); err != nil {
			t.Fatalf("%q: fast and encoding/json differ: %v", value, err)
		}
	})
}

// Invariant: decodeOrderFast either declines a record or reads it exactly
// as encoding/json's strict decoder does (which DecodeOrder used for every
// record before). Seeds: records as EncodeOrder writes them, and near
// misses that the fast path must decline or read the same.
func FuzzDecodeOrder(f *testing.F) {
	at := time.Date(2026, 11, 27, 0, 30, 1, 5000, time.UTC)
	for _, o := range []Order{
		{SKU: "tee", ID: "o-1", Qty: 1, Parts: []Part{{Place: Segment(3), Qty: 1}}, Created: at},
		{SKU: "tee", ID: "o-2", Qty: 2, Parts: []Part{{Place: Pool, Qty: 1}, {Place: Segment(0), Qty: 1}}, Created: at.In(time.FixedZone("x", 5*3600+1800)),
			State: StateReserved, Deadline: at.Add(time.Minute), Buyer: "u-1", UserCounted: true},
		{SKU: "tee", ID: "o-3", Qty: 3, Parts: []Part{{Place: Segment(1023), Qty: 3}}, Released: true, Created: at, State: StateConfirmed, Deadline: at},
		{SKU: "tee", ID: "o-4", State: StatePruned, PrunedAt: at},
	} {
		f.Add([]byte(EncodeOrder(o)))
	}
	for _, s := range []string{
		`{"v":1,"sku":"tee","order":"o","qty":1,"parts":[{"from":"seg/1","qty":1}]}`,
		`{"v":1,"sku":"tee","order":"o","qty":1,"parts":[]}`,
		`{"v":1,"sku":"tee","order":"o","qty":01,"parts":[{"from":"seg/01","qty":1}]}`,
		`{"v":1,"sku":"tee","order":"o","qty":-1}`,
		`{"v":1,"sku":"t\u0065e","order":"o"}`,
		`{"v":1,"SKU":"tee","order":"o"}`,
		`{"v":1,"sku":"tee","order":"o","created":"2026-11-27T00:30:01+05:30"} `,
		`{"v":1,"sku":"tee","order":"o","created":"2026-11-27T00:30:01.000Z"}`,
		`{"v":1,"sku":"tee","order":"o","created":"2026-11-27 00:30:01Z"}`,
		`{"v":1,"sku":"tee","order":"o","released":false}`,
		`{"v":1,"sku":"tee","order":"o","qty":9223372036854775807}`,
		`{"v":1,"sku":"tee","order":"o","qty":9223372036854775808}`,
		`{"v":1,"sku":"tee","order":"o","qty":-9223372036854775808}`,
		`{"v":1,"sku":"tee","order":"o","qty":-0}`,
		`{"v":1,"sku":"tee","order":"o","qty":99999999999999999999999}`,
	} {
		f.Add([]byte(s))
	}
	fuzzAgainstJSON(f, decodeOrderFast, sameOrder)
}

// Plain orders and reservations, as EncodeOrder writes them, take the fast
// path, so that FuzzDecodeOrder compares it with something.
func TestDecodeOrderFastPath(t *testing.T) {
	for _, o := range fastPathOrders() {
		got, ok := decodeOrderFast([]byte(EncodeOrder(o)))
		if !ok {
			t.Fatalf("%s: declined", o.ID)
		}
		if err := sameOrder(got, o); err != nil {
			t.Fatalf("%s: %v", o.ID, err)
		}
	}
}

// BenchmarkDecodeOrder: a plain order's record, the fast path against
// encoding/json.
func BenchmarkDecodeOrder(b *testing.B) {
	rec := []byte(EncodeOrder(Order{SKU: "tee", ID: "c0-g1-17", Qty: 2, Parts: []Part{{Place: Segment(3), Qty: 1}, {Place: Segment(4), Qty: 1}},
		Created: time.Date(2026, 11, 27, 0, 30, 1, 5, time.UTC)}))
	b.Run("DecodeOrder", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeOrder("k", rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var o Order
			if err := strictJSON(rec, &o); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// sameMeta compares two decoded meta records field by field, Created by
// sameTimes.
func sameMeta(a, b Meta) error {
	as, bs := a, b
	as.Created, bs.Created = time.Time{}, time.Time{}
	if as != bs {
		return fmt.Errorf("%#v\n  against %#v", as, bs)
	}
	return sameTimes([2]time.Time{a.Created, b.Created})
}

// metaFastPath are meta records as EncodeMeta writes them: every optional
// field present and absent.
func metaFastPath() []Meta {
	at := time.Date(2026, 11, 27, 3, 0, 1, 5000, time.UTC)
	return []Meta{
		{V: Version, Total: 1000, Segments: 20, LowWatermark: 10, RefillBatch: 50, Created: at},
		{V: Version, Total: 0, Segments: 1, Created: at.In(time.FixedZone("x", -3*3600))},
		{V: Version, Total: MaxTotal, Segments: MaxSegments, LowWatermark: 1, RefillBatch: 1, PerUserLimit: 2, Created: at},
		{V: Version, Total: 7, Segments: 3, Creating: true, InitialFill: 6, Created: at},
		{V: Version, Total: 7, Segments: 3},
	}
}

// Invariant: decodeMetaFast either declines a record or reads it exactly
// as encoding/json's strict decoder does. Seeds: records as EncodeMeta
// writes them, and near misses the fast path must decline or read the same.
func FuzzDecodeMeta(f *testing.F) {
	for _, m := range metaFastPath() {
		f.Add([]byte(EncodeMeta(m)))
	}
	for _, s := range []string{
		`{"v":1,"total":5,"segments":2,"lowWatermark":0,"refillBatch":0,"created":"2026-11-27T03:00:01Z"}`,
		`{"v":1,"total":5,"segments":2,"lowWatermark":0,"refillBatch":0,"created":"2026-11-27T03:00:01Z","extra":1}`,
		`{"v":1,"total":05,"segments":2,"lowWatermark":0,"refillBatch":0,"created":"2026-11-27T03:00:01Z"}`,
		`{"v":1,"total":5,"segments":2,"lowWatermark":0,"refillBatch":0,"perUserLimit":0,"creating":false,"created":"2026-11-27T03:00:01Z"}`,
		`{"v":1,"total":5,"segments":9223372036854775807,"lowWatermark":0,"refillBatch":0,"created":"2026-11-27T03:00:01Z"}`,
		`{"v":1,"total":5,"segments":2,"lowWatermark":-1,"refillBatch":0,"created":"2026-11-27 03:00:01Z"}`,
		`{"v":1,"total":5,"segments":2,"lowWatermark":0,"refillBatch":0,"created":"2026-11-27T03:00:01.000+05:30"} `,
		`{"total":5,"v":1,"segments":2,"lowWatermark":0,"refillBatch":0,"created":"2026-11-27T03:00:01Z"}`,
	} {
		f.Add([]byte(s))
	}
	fuzzAgainstJSON(f, decodeMetaFast, sameMeta)
}

// Meta records as EncodeMeta writes them take the fast path, so that
// FuzzDecodeMeta compares it with something.
func TestDecodeMetaFastPath(t *testing.T) {
	for i, m := range metaFastPath() {
		got, ok := decodeMetaFast([]byte(EncodeMeta(m)))
		if !ok {
			t.Fatalf("meta %d: declined: %s", i, EncodeMeta(m))
		}
		if err := sameMeta(got, m); err != nil {
			t.Fatalf("meta %d: %v", i, err)
		}
	}
}

// BenchmarkDecodeMeta: a SKU's meta record, DecodeMeta (the fast path)
// against encoding/json.
func BenchmarkDecodeMeta(b *testing.B) {
	rec := []byte(EncodeMeta(Meta{Total: 2_000_000, Segments: 20, LowWatermark: 50, RefillBatch: 200,
		Created: time.Date(2026, 11, 27, 3, 0, 1, 5, time.UTC)}))
	b.Run("DecodeMeta", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeMeta("k", rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m Meta
			if err := strictJSON(rec, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}

package segments

import (
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Unit tests of the returner's planning, without etcd: which returns share
// a transaction, and where their units go.

func testReturn(sku *skuInfo, id string, qty int64, buyer string, reserved bool) *returnReq {
	o := Order{SKU: sku.name, ID: id, Qty: qty, Parts: []Part{{Place: Segment(1), Qty: qty}}}
	if buyer != "" {
		o.Buyer, o.UserCounted = buyer, true
	}
	if reserved {
		o.State, o.Deadline = StateReserved, time.Unix(1e9, 0)
	}
	return &returnReq{info: sku, o: o, kv: &mvccpb.KeyValue{Key: []byte("/t/orders/" + sku.name + "/" + id), ModRevision: 7}}
}

func TestSelectReturnsFitsMaxTxnOps(t *testing.T) {
	e := testEngine(t)
	s := &skuInfo{name: "s", segments: 4}
	tests := []struct {
		name  string
		queue func() []*returnReq
		want  int
	}{
		// The SKU's one inbox: 1 compare, 1 put, 1 read; each plain
		// return 1, 1, 1 (its record): n + 1 <= 128.
		{"plain allocations of one SKU", func() []*returnReq {
			var q []*returnReq
			for i := range 200 {
				q = append(q, testReturn(s, fmt.Sprint("o", i), 1, "", false))
			}
			return q
		}, 127},
		// Reservations also delete their index key: 2n + 1 puts <= 128.
		{"reservations", func() []*returnReq {
			var q []*returnReq
			for i := range 200 {
				q = append(q, testReturn(s, fmt.Sprint("r", i), 1, "", true))
			}
			return q
		}, 63},
		// Two buyers' counters: n + 3 <= 128.
		{"two buyers", func() []*returnReq {
			var q []*returnReq
			for i := range 200 {
				q = append(q, testReturn(s, fmt.Sprint("o", i), 1, fmt.Sprint("b", i%2), false))
			}
			return q
		}, 125},
		// A SKU a return: an inbox each, 2n <= 128.
		{"a SKU a return", func() []*returnReq {
			var q []*returnReq
			for i := range 200 {
				q = append(q, testReturn(&skuInfo{name: fmt.Sprint("s", i), segments: 4}, "o", 1, "", false))
			}
			return q
		}, 64},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := tc.queue()
			first := q[0]
			batch, rest := e.selectReturns(q)
			if len(batch) != tc.want || len(batch)+len(rest) != 200 {
				t.Fatalf("batch %d, rest %d; want %d in the batch", len(batch), len(rest), tc.want)
			}
			if batch[0] != first {
				t.Errorf("not in arrival order")
			}
			// What the plan writes must fit, as selectReturns counted it.
			p := e.planReturns(batch)
			puts := len(p.counters) + len(batch)
			for _, r := range batch {
				if r.o.State == StateReserved {
					puts++
				}
			}
			if cmps := len(p.counters) + len(batch); cmps > 128 || puts > 128 {
				t.Errorf("the plan compares %d and writes %d keys: over 128", cmps, puts)
			}
		})
	}
}

func TestSelectReturnsNeverTwoOfOneRecord(t *testing.T) {
	e := testEngine(t)
	s := &skuInfo{name: "s", segments: 4}
	q := []*returnReq{testReturn(s, "a", 1, "", false), testReturn(s, "b", 1, "", false), testReturn(s, "a", 1, "", false), testReturn(s, "c", 1, "", false)}
	second := q[2]
	batch, rest := e.selectReturns(q)
	if len(batch) != 3 || len(rest) != 1 || rest[0] != second {
		t.Fatalf("batch %d, rest %d; want the second \"a\" alone left for the next transaction", len(batch), len(rest))
	}
}

// Every unit of a SKU's returns in one transaction goes to the inbox its
// first return's order ID routes to; buyers' counters lose what their
// orders counted; another SKU has its own inbox.
func TestPlanReturns(t *testing.T) {
	e := testEngine(t)
	s := &skuInfo{name: "s", segments: 4}
	u := &skuInfo{name: "u", segments: 4}
	batch := []*returnReq{testReturn(s, "o1", 2, "amy", false), testReturn(s, "o2", 3, "bob", true),
		testReturn(u, "o3", 1, "amy", false), testReturn(s, "o4", 4, "amy", false)}
	p := e.planReturns(batch)
	sIn, uIn := e.keys.Inbox("s", Route("o1", 4)), e.keys.Inbox("u", Route("o3", 4))
	want := []string{sIn, e.keys.User("s", "amy"), e.keys.User("s", "bob"), uIn, e.keys.User("u", "amy")}
	if fmt.Sprint(p.counters) != fmt.Sprint(want) {
		t.Fatalf("counters %v; want %v", p.counters, want)
	}
	if p.give[sIn] != 9 || p.give[uIn] != 1 || len(p.give) != 2 {
		t.Errorf("inboxes gain %v; want %s 9, %s 1", p.give, sIn, uIn)
	}
	if p.take[e.keys.User("s", "amy")] != 6 || p.take[e.keys.User("s", "bob")] != 3 || p.take[e.keys.User("u", "amy")] != 1 {
		t.Errorf("buyers lose %v", p.take)
	}
}

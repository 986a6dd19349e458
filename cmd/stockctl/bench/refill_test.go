package bench

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/segments"
)

// The observer on counters written by hand: it counts an inbox rise as a
// refill only after a crossing below the watermark, judges a crossing on the
// state between revisions (not inside a transaction), and counts the
// segments still waiting.
func TestRefillObserver(t *testing.T) {
	cli := startEtcd(t, 1)[0]
	const prefix, sku, watermark = "/refill-test/", "hot", 10
	space, err := keys.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	seg := func(i int, n int64) clientv3.Op {
		return clientv3.OpPut(space.Segment(sku, i), segments.EncodeCounter(n))
	}
	in := func(i int, n int64) clientv3.Op {
		return clientv3.OpPut(space.Inbox(sku, i), segments.EncodeCounter(n))
	}
	var rev int64
	write := func(ops ...clientv3.Op) {
		t.Helper()
		resp, err := cli.Txn(t.Context()).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	// Segment 2 starts below the watermark: it waits for nothing.
	write(seg(0, 20), in(0, 0), seg(1, 20), in(1, 0), seg(2, 3), in(2, 0), clientv3.OpPut(space.Pool(sku), segments.EncodeCounter(1000)))
	o, err := ObserveRefills(t.Context(), cli, prefix, sku, 3, watermark)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Stop()

	write(in(2, 5))  // segment 2: stock arrives, but nothing waited
	write(seg(0, 5)) // segment 0 crosses
	write(in(0, 3))  // and gets some: refill 1, still below (8)
	// An order absorbs segment 0's inbox: counter first, then the inbox,
	// in one transaction. Between revisions it goes from 8 to 7, no
	// crossing (read event by event, 7 + 3 = 10 then 7 would look like one).
	write(seg(0, 7), in(0, 0))
	write(in(0, 20))            // stock arrives, nothing waited: not a refill
	write(seg(1, 9))            // segment 1 crosses
	write(seg(1, 8))            // further down: still the same wait
	write(in(1, 30))            // refill 2
	write(seg(0, 25), in(0, 0)) // an absorb back above the watermark
	write(seg(0, 1))            // segment 0 crosses again and waits at the end

	// Wait (bounded: this only catches a stuck watch) for the observer
	// to have applied the last write, then stop it.
	deadline := time.Now().Add(30 * time.Second)
	for o.appliedRevision() < rev {
		if time.Now().After(deadline) {
			t.Fatalf("the observer applied revision %d of %d", o.appliedRevision(), rev)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := o.Stop()
	if r.Err != nil || len(r.Latencies) != 2 || r.Pending != 1 {
		t.Fatalf("observed %d refills, %d pending, err %v; want 2, 1, nil", len(r.Latencies), r.Pending, r.Err)
	}
	for _, l := range r.Latencies {
		if l < 0 {
			t.Errorf("negative latency %v", l)
		}
	}
	if again := o.Stop(); len(again.Latencies) != 2 || again.Pending != 1 {
		t.Errorf("a second Stop: %+v", again)
	}
}

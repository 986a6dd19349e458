package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/segments"
)

// RefillObserver times refills from outside the rebalancer: one watch on a
// SKU's stock counters, which timestamps the revision that takes a
// segment's stock (counter + inbox) below the low watermark and the
// revision that raises its inbox afterwards. Both arrive on the same watch
// stream, so the stream's delivery delay cancels out.
//
// An inbox rise is stock arriving, whoever moved it: the rebalancer's
// refill, a selling process's pull from the pool into one of its own
// segments (recorded under the pulls/<sku> key), or a released order's
// units returning. The figure is how long a segment that ran low waited
// for more stock, which is what a buyer of that segment feels, not the
// latency of the rebalancer alone (rebalance.Move.Latency is that).
//
// A segment already below the watermark when the observer starts is not
// waiting for anything until it rises to or above it and falls again.
type RefillObserver struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	mu      sync.Mutex
	lat     []time.Duration
	crossed []time.Time // per segment; zero: not waiting for stock
	err     error
	applied int64 // the last revision applied
}

// RefillResult is what a RefillObserver saw.
type RefillResult struct {
	// Latencies run from each crossing below the watermark to the inbox
	// rise that ended it, sorted.
	Latencies []time.Duration
	// Pending counts the segments that had crossed below the watermark
	// and were still waiting for stock when the observer stopped.
	Pending int
	// Err is why the watch ended before Stop (a compacted revision, a
	// closed client); the figures then stop there.
	Err error
}

// ObserveRefills starts observing the stock of sku, under the coordinator
// key prefix prefix, which has segs segments and the low watermark
// lowWatermark (the rebalancer's threshold: a segment below it needs
// stock; 0 means 1, as for the rebalancer). ctx bounds the first read
// only: the observation goes on until Stop, which must be called. On
// failure nothing is left running.
func ObserveRefills(ctx context.Context, cli *clientv3.Client, prefix, sku string, segs int, lowWatermark int64) (*RefillObserver, error) {
	space, err := keys.New(prefix)
	if err != nil {
		return nil, err
	}
	watermark := max(lowWatermark, 1)
	resp, err := cli.Get(ctx, space.SKUStock(sku), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read the stock of %s: %w", sku, err)
	}
	seg, in := make([]int64, segs), make([]int64, segs)
	// parse decodes a segment counter or inbox (anything else: ok false).
	parse := func(key, value []byte) (k keys.StockKey, n int64, ok bool) {
		k, err := space.ParseStock(string(key))
		if err != nil || k.Kind == keys.KindPool || k.SKU != sku || k.Index < 0 || k.Index >= segs {
			return k, 0, false
		}
		if n, err = segments.DecodeCounter(string(key), value); err != nil {
			return k, 0, false
		}
		return k, n, true
	}
	for _, kv := range resp.Kvs {
		if k, n, ok := parse(kv.Key, kv.Value); ok {
			if k.Kind == keys.KindInbox {
				in[k.Index] = n
			} else {
				seg[k.Index] = n
			}
		}
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	o := &RefillObserver{cancel: cancel, done: make(chan struct{}), crossed: make([]time.Time, segs)}
	wch := cli.Watch(wctx, space.SKUStock(sku), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	go func() {
		defer close(o.done)
		// A segment's state at the start of the revision being applied:
		// one transaction can write a segment's counter and its inbox
		// (an order absorbing the inbox), and only the state between
		// revisions is real.
		type start struct{ seg, in int64 }
		touched := map[int]start{}
		var rev int64
		settle := func(now time.Time) {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.applied = max(o.applied, rev)
			for i, b := range touched {
				before, after := b.seg+b.in, seg[i]+in[i]
				switch {
				case in[i] > b.in && !o.crossed[i].IsZero():
					o.lat = append(o.lat, now.Sub(o.crossed[i]))
					o.crossed[i] = time.Time{}
				case before >= watermark && after < watermark:
					o.crossed[i] = now
				}
			}
			clear(touched)
		}
		for wr := range wch {
			if err := wr.Err(); err != nil {
				if wctx.Err() == nil {
					o.mu.Lock()
					o.err = err
					o.mu.Unlock()
				}
				return
			}
			now := time.Now()
			for _, ev := range wr.Events {
				if ev.Kv.ModRevision != rev {
					settle(now)
					rev = ev.Kv.ModRevision
				}
				k, n, ok := parse(ev.Kv.Key, ev.Kv.Value)
				if !ok {
					continue
				}
				i := k.Index
				if _, seen := touched[i]; !seen {
					touched[i] = start{seg: seg[i], in: in[i]}
				}
				if k.Kind == keys.KindInbox {
					in[i] = n
				} else {
					seg[i] = n
				}
			}
			// etcd does not split a revision's events over responses
			// (this watch asks for no fragmenting).
			settle(now)
		}
		if wctx.Err() == nil {
			o.mu.Lock()
			o.err = errors.New("the watch closed")
			o.mu.Unlock()
		}
	}()
	return o, nil
}

// appliedRevision is the last revision the observer applied (for tests).
func (o *RefillObserver) appliedRevision() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.applied
}

// Stop ends the observation, waits for the watch to end, and returns what
// the observer saw. It may be called more than once.
func (o *RefillObserver) Stop() RefillResult {
	o.once.Do(func() {
		o.cancel()
		<-o.done
	})
	o.mu.Lock()
	defer o.mu.Unlock()
	r := RefillResult{Latencies: slices.Clone(o.lat), Err: o.err}
	slices.Sort(r.Latencies)
	for _, t := range o.crossed {
		if !t.IsZero() {
			r.Pending++
		}
	}
	return r
}

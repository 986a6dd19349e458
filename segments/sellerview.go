package segments

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/internal/lock"
)

// watch keeps the view of the SKU's segment lock keys, and acts on it.
func (s *seller) watch(ctx context.Context) {
	pfx := s.e.keys.StockLocks(s.sku.name)
	for ctx.Err() == nil {
		resp, err := s.e.kv.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			if !background.Sleep(ctx, 100*time.Millisecond) {
				return
			}
			continue
		}
		s.mu.Lock()
		for i := range s.view {
			clear(s.view[i])
		}
		for _, kv := range resp.Kvs {
			s.applyLocked(kv, false)
		}
		s.mu.Unlock()
		select {
		case <-s.viewed:
		default:
			close(s.viewed)
		}
		s.react()
		wctx, cancel := context.WithCancel(ctx)
		for wr := range s.e.client.Watch(wctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil || wr.CompactRevision != 0 {
				break
			}
			s.mu.Lock()
			for _, ev := range wr.Events {
				s.applyLocked(ev.Kv, ev.Type == mvccpb.DELETE)
			}
			s.mu.Unlock()
			s.react()
		}
		cancel()
	}
}

func (s *seller) applyLocked(kv *mvccpb.KeyValue, deleted bool) {
	k, err := s.e.keys.ParseStockLock(string(kv.Key))
	if err != nil || k.Kind != keys.KindSegment || k.Index >= len(s.view) {
		return
	}
	if deleted {
		delete(s.view[k.Index], string(kv.Key))
		return
	}
	s.view[k.Index][string(kv.Key)] = lockKey{rev: kv.CreateRevision, lease: k.Lease}
}

// react applies the yield policy to every held segment another process
// waits for, and wakes the head waiter (a segment may have come free).
func (s *seller) react() {
	self := s.self()
	held := s.heldCount()
	s.mu.Lock()
	lo, _ := shareOf(s.view, self)
	type contended struct {
		i   int
		own *lock.Ownership
	}
	var yieldNow, keep []contended
	for i, q := range s.qs {
		own, idle := q.Tenure()
		if own == nil || !waitedFor(s.view[i], own.Key(), own.Rev()) {
			if t := s.timers[i]; t != nil {
				t.Stop()
				delete(s.timers, i)
			}
			continue
		}
		if yieldAtOnce(idle, held, lo) {
			yieldNow = append(yieldNow, contended{i, own})
			held--
		} else if s.timers[i] == nil {
			keep = append(keep, contended{i, own})
		}
	}
	for _, k := range keep {
		q, own, i := s.qs[k.i], k.own, k.i
		s.timers[i] = time.AfterFunc(s.e.cfg.TenureMaxHold, func() {
			s.mu.Lock()
			delete(s.timers, i)
			s.mu.Unlock()
			q.Yield(own)
		})
	}
	s.mu.Unlock()
	for _, y := range yieldNow {
		s.qs[y.i].Yield(y.own)
	}
	s.wakeHead()
}

// wakeHead signals the oldest waiting order to look for a slot.
func (s *seller) wakeHead() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.waiters.Front(); f != nil {
		select {
		case f.Value.(*slotWaiter).wake <- struct{}{}:
		default:
		}
	}
}

package segments

import (
	"context"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/etcdwatch"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/internal/lock"
)

// The lock watch. Every seller needs to see who holds and who waits for
// its SKU's segment locks (the fair share, the yield policy). One watch per
// process covers every SKU's segment lock keys: it keeps the keys that
// exist (a process holds a handful per SKU it sells, none for an idle one)
// and hands each change to the seller of its SKU, if this process has one.
// A SKU therefore costs no goroutine and no etcd watch of its own, and a
// seller made for a new SKU takes its view from the watch without a read.

// lockWatch is the process's one watch of the segment lock keys.
type lockWatch struct {
	e *Engine

	// mu guards everything below, and is taken before a seller's mu
	// (never the other way round).
	mu      sync.Mutex
	started bool
	ready   bool                          // the keys are as of a full read plus every event since
	keys    map[string]map[string]lockKey // SKU → key → what it is
	sellers map[string]*seller            // SKU → its seller, to hand changes to
	index   map[string]keys.StockLockKey  // key → parsed
	// lastParsed is the key applyLocked parsed last.
	lastParsed keys.StockLockKey
}

func newLockWatch(e *Engine) *lockWatch {
	return &lockWatch{e: e, keys: map[string]map[string]lockKey{}, sellers: map[string]*seller{}, index: map[string]keys.StockLockKey{}}
}

// register gives s its view and hands it every change from now on; it
// starts the watch on first use. s's viewed closes once its view is real.
func (w *lockWatch) register(s *seller) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sellers[s.sku.name] = s
	if !w.started {
		w.started = true
		w.e.bg.Go(w.run)
	}
	if w.ready {
		w.fillLocked(s)
	}
}

// unregister stops handing changes to s (it is being evicted).
func (w *lockWatch) unregister(s *seller) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sellers[s.sku.name] == s {
		delete(w.sellers, s.sku.name)
	}
}

// fillLocked copies the SKU's keys into s's view and marks it viewed.
func (w *lockWatch) fillLocked(s *seller) {
	s.mu.Lock()
	for i := range s.view {
		clear(s.view[i])
	}
	for key, k := range w.keys[s.sku.name] {
		if p := w.index[key]; p.Index < len(s.view) {
			s.view[p.Index][key] = k
		}
	}
	s.mu.Unlock()
	select {
	case <-s.viewed:
	default:
		close(s.viewed)
	}
}

// run keeps the keys: a full read, then a watch from the revision after it;
// when the watch breaks (compaction, a lost connection), again.
func (w *lockWatch) run(ctx context.Context) {
	etcdwatch.Follow(ctx, w.e.kv, w.e.client, w.e.keys.StockLocksPrefix(), w.load, w.apply, func() {
		w.mu.Lock()
		w.ready = false
		w.mu.Unlock()
	})
}

// load replaces the keys with a full read's, and every seller's view.
func (w *lockWatch) load(resp *clientv3.GetResponse) {
	w.mu.Lock()
	clear(w.keys)
	clear(w.index)
	for _, kv := range resp.Kvs {
		w.applyLocked(kv, false)
	}
	w.ready = true
	sellers := make([]*seller, 0, len(w.sellers))
	for _, s := range w.sellers {
		w.fillLocked(s)
		sellers = append(sellers, s)
	}
	w.mu.Unlock()
	for _, s := range sellers {
		s.react()
	}
}

// apply takes a watch response's events; the sellers whose SKU they touch
// react, after those whose key someone else deleted have been told.
func (w *lockWatch) apply(evs []*clientv3.Event) {
	w.mu.Lock()
	touched := map[*seller]bool{}
	var deleted []deletedKey
	for _, ev := range evs {
		del := ev.Type == mvccpb.DELETE
		if s := w.applyLocked(ev.Kv, del); s != nil {
			touched[s] = true
			if del {
				deleted = append(deleted, deletedKey{s, w.lastParsed.Index, string(ev.Kv.Key), ev.Kv.ModRevision})
			}
		}
	}
	w.mu.Unlock()
	for _, d := range deleted {
		d.s.lostKey(d.seg, d.key, d.rev)
	}
	for s := range touched {
		s.react()
	}
}

// deletedKey is a segment lock key of a seller's SKU that the watch saw
// deleted at rev.
type deletedKey struct {
	s   *seller
	seg int
	key string
	rev int64
}

// lostKey ends this process's tenure of segment seg if key, deleted at rev,
// was its key: deleted by someone else (a revoked lease, an operator), as
// the process's release would have given the tenure up first. The
// session's keepalive would notice a revoked lease too, but only at its
// next renewal; the next commit under the key would fail its compare.
func (s *seller) lostKey(seg int, key string, rev int64) {
	q := s.qs[seg].Load()
	if q == nil {
		return // never made: no tenure there
	}
	own, _ := q.Tenure()
	if own != nil && own.Key() == key && own.Rev() < rev {
		q.Lose(own, lock.ErrLost)
	}
}

// applyLocked records one key's change, in the keys and in the view of its
// SKU's seller, and returns that seller (nil if none).
func (w *lockWatch) applyLocked(kv *mvccpb.KeyValue, deleted bool) *seller {
	key := string(kv.Key)
	k, err := w.e.keys.ParseStockLock(key)
	if err != nil || k.Kind != keys.KindSegment {
		return nil
	}
	w.lastParsed = k
	s := w.sellers[k.SKU]
	if deleted {
		if m := w.keys[k.SKU]; m != nil {
			delete(m, key)
			if len(m) == 0 {
				delete(w.keys, k.SKU)
			}
		}
		delete(w.index, key)
	} else {
		m := w.keys[k.SKU]
		if m == nil {
			m = map[string]lockKey{}
			w.keys[k.SKU] = m
		}
		m[key] = lockKey{rev: kv.CreateRevision, lease: k.Lease}
		w.index[key] = k
	}
	if s == nil || k.Index >= len(s.view) {
		return nil
	}
	s.mu.Lock()
	if deleted {
		delete(s.view[k.Index], key)
	} else {
		s.view[k.Index][key] = lockKey{rev: kv.CreateRevision, lease: k.Lease}
	}
	s.mu.Unlock()
	return s
}

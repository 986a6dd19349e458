package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/segments"
)

// watchRateWindow is the sliding window of orders/s and refills/s: long
// enough to smooth a bursty sale, short enough that the rates fall to 0 a
// few seconds after it stops.
const watchRateWindow = 5 * time.Second

// saleState is what status --watch knows of one SKU. load reads it whole:
// a coordinator.Status snapshot, plus the lock and election keys at the
// snapshot's revision; apply brings it forward with the watch's events
// from that revision on. The rates and the bar scale outlive a reload.
// One goroutine owns it.
type saleState struct {
	keys keys.Space
	sku  string

	meta    segments.Meta
	total   int64
	pool    int64
	counter []int64 // each segment's own units; its remaining is counter + inbox
	inbox   []int64
	// counterRev is, per segment, the revision its units were last known
	// exactly at: a counter written with its units (not a lazy one's
	// takeover or mark, which leave them as they were), or the load. An
	// order record created after it takes its parts off the segment's
	// units: a segment sold lazily (segments.SegmentCounter) is written
	// only now and then.
	counterRev []int64
	orders     int64 // keys under the SKU's orders: records, released ones included, and pruned orders' claims
	claims     int64 // the claims among them (the archive record's count)
	pass       *segments.RebalancePass
	// reservations maps each live reservation's index key to its units;
	// sawReservations says the SKU had one since the watch began, and
	// from then on frames carry reserved and confirmed figures.
	reservations    map[string]int64
	sawReservations bool
	// locks maps a place (a segment's index, or -1 for the pool) to the
	// waiter keys under its lock: lease → the key's create revision. The
	// oldest key holds the lock.
	locks map[int]map[int64]int64
	// idents maps a lease to the identity its lock keys carry (the
	// holder's --identity, coordinator.WithIdentity).
	idents map[int64]string
	// candidates are the keys under the rebalancer's election prefix; the
	// oldest one leads.
	candidates map[string]candidate
	// loadRev is the revision load read at: the watches start after it.
	// rev is the revision of the latest change applied since.
	loadRev, rev int64

	// What survives a reload.
	started         time.Time // when the watch began, for the rates' first seconds
	ordersW, refill rateWindow
	full            int64 // the most any segment held since the watch began
}

// candidate is one key under the rebalancer's election prefix.
type candidate struct {
	createRev int64
	lease     int64 // 0 if the key does not end in a lease
	identity  string
}

func newSaleState(space keys.Space, sku string, now time.Time) *saleState {
	return &saleState{keys: space, sku: sku, started: now}
}

// electionPrefix is where the rebalancer's candidates put their keys
// (concurrency.Election adds "/" and the lease in hexadecimal).
func (s *saleState) electionPrefix() string { return s.keys.Election() + "/" }

// load reads the SKU's state afresh. It is the only place status --watch
// reads from etcd; everything else comes from the watch. ctx bounds the
// reads; on failure s is unchanged.
func (s *saleState) load(ctx context.Context, c *coordinator.Coordinator) error {
	st, err := c.Status(ctx, s.sku)
	if err != nil {
		return err
	}
	// The lock and election keys at the snapshot's revision, so that the
	// watches that start after it miss nothing.
	at := clientv3.WithRev(st.Revision)
	resp, err := engines.Of(c).KV.Txn(ctx).Then(
		clientv3.OpGet(s.keys.StockLocks(s.sku), clientv3.WithPrefix(), at),
		clientv3.OpGet(s.electionPrefix(), clientv3.WithPrefix(), at),
		clientv3.OpGet(s.keys.Reservations(s.sku), clientv3.WithPrefix(), at),
	).Commit()
	if err != nil {
		return fmt.Errorf("read the lock and election keys of %s: %w", s.sku, err)
	}
	s.meta, s.total, s.pool, s.orders, s.claims, s.pass = st.Meta, st.Total, st.Pool, st.Orders+st.PrunedClaims, st.PrunedClaims, st.Rebalancer
	s.counter, s.inbox = make([]int64, len(st.Segments)), make([]int64, len(st.Segments))
	s.counterRev = make([]int64, len(st.Segments))
	for i, seg := range st.Segments {
		s.counter[i], s.inbox[i], s.counterRev[i] = seg.Remaining-seg.Inbox, seg.Inbox, st.Revision
	}
	s.locks, s.idents = map[int]map[int64]int64{}, map[int64]string{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		s.putLockKey(kv)
	}
	s.candidates = map[string]candidate{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		s.putCandidate(kv)
	}
	s.reservations = map[string]int64{}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		if err := s.putReservation(kv); err != nil {
			return err
		}
	}
	s.loadRev, s.rev = st.Revision, st.Revision
	s.observeFull()
	return nil
}

// apply brings s forward by one watch response of the whole prefix. A
// response carries every event of one or more whole revisions (etcd never
// splits a revision between responses), so after apply s is the SKU's
// state at a revision, as status would read it. Events of other SKUs and
// of keys the view does not show are skipped. It reports whether anything
// s shows changed. On error (a record that does not decode, the SKU
// deleted) s is left part way and must be reloaded.
func (s *saleState) apply(evs []*clientv3.Event, now time.Time) (changed bool, err error) {
	var stock, orders, locks, election, last []*clientv3.Event
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		switch {
		case key == s.keys.Meta(s.sku):
			if err := s.applyMeta(ev); err != nil {
				return changed, err
			}
			changed = true
			s.rev = max(s.rev, ev.Kv.ModRevision)
		case strings.HasPrefix(key, s.keys.SKUStock(s.sku)):
			stock = append(stock, ev)
		case strings.HasPrefix(key, s.keys.Orders(s.sku)):
			orders = append(orders, ev)
		case strings.HasPrefix(key, s.keys.StockLocks(s.sku)):
			locks = append(locks, ev)
		case strings.HasPrefix(key, s.electionPrefix()):
			election = append(election, ev)
		case key == s.keys.Archive(s.sku):
			// A prune: the claims it keeps are keys under orders/, not
			// orders.
			if ev.Type == clientv3.EventTypeDelete {
				s.claims = 0
			} else if a, err := segments.DecodeArchive(key, ev.Kv.Value); err == nil {
				s.claims = a.Claims
			}
			changed = true
		case key == s.keys.RebalanceLast():
			last = append(last, ev)
		case strings.HasPrefix(key, s.keys.Reservations(s.sku)):
			if ev.Type == clientv3.EventTypeDelete {
				delete(s.reservations, key)
			} else if err := s.putReservation(ev.Kv); err != nil {
				return true, err
			}
			changed = true
		}
	}
	if err := s.applyStock(stock, now); err != nil {
		return true, err
	}
	s.applyOrders(orders, now)
	s.applyLocks(locks)
	s.applyElection(election)
	if err := s.applyLastPass(last); err != nil {
		return true, err
	}
	return changed || len(stock)+len(orders)+len(locks)+len(election)+len(last) > 0, nil
}

// applyMeta applies a change of the SKU's meta record: a restock raises
// the total (in the same transaction as the pool, so in the same
// response). A deleted record means the SKU is gone; status would say so.
func (s *saleState) applyMeta(ev *clientv3.Event) error {
	if ev.Type == mvccpb.DELETE {
		return fmt.Errorf("%w: its meta record was deleted at revision %d", coordinator.ErrUnknownSKU, ev.Kv.ModRevision)
	}
	m, err := segments.DecodeMeta(string(ev.Kv.Key), ev.Kv.Value)
	if err != nil {
		return err
	}
	if m.Segments != len(s.counter) {
		// The count is fixed at creation; a record saying otherwise is
		// another SKU of the same name, which only a reload can show.
		return fmt.Errorf("the meta record of %s now says %d segments, not %d", s.sku, m.Segments, len(s.counter))
	}
	s.meta, s.total = m, m.Total
	return nil
}

// applyStock applies events under the SKU's stock prefix: the pool, the
// segments' counters and their inboxes. An inbox that grows is a refill
// (the rebalancer's, or a selling process's pull from the pool). A counter
// that does not decode is an error: status would fail on it too.
func (s *saleState) applyStock(evs []*clientv3.Event, now time.Time) error {
	refills := 0
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		k, err := s.keys.ParseStock(key)
		if err != nil || k.SKU != s.sku || k.Index >= len(s.counter) {
			continue // not one of the SKU's counters (status would fail on it; a view can go on)
		}
		var v int64 // a deleted counter holds nothing
		exact := true
		if ev.Type == mvccpb.PUT {
			if k.Kind == keys.KindSegment {
				c, err := segments.DecodeSegmentCounter(key, ev.Kv.Value)
				if err != nil {
					return err
				}
				// A lazy counter rewritten with an explicit base (taken
				// over, or marked by a lock holder) holds what it held.
				v, exact = c.N, c.Base == 0
			} else if v, err = segments.DecodeCounter(key, ev.Kv.Value); err != nil {
				return err
			}
		}
		switch k.Kind {
		case keys.KindPool:
			s.pool = v
		case keys.KindSegment:
			if exact {
				s.counter[k.Index], s.counterRev[k.Index] = v, ev.Kv.ModRevision
			}
		case keys.KindInbox:
			if v > s.inbox[k.Index] {
				refills++
			}
			s.inbox[k.Index] = v
		}
		s.rev = max(s.rev, ev.Kv.ModRevision)
	}
	s.refill.add(now, refills)
	s.observeFull()
	return nil
}

// applyOrders applies events under the SKU's orders prefix. A put that
// creates its key is a new order; a put that updates one is a release (or
// a prune's claim, counted by the archive record), which the stock
// counters already show.
func (s *saleState) applyOrders(evs []*clientv3.Event, now time.Time) {
	created := 0
	for _, ev := range evs {
		switch {
		case ev.Type == mvccpb.DELETE:
			s.orders--
		case ev.Kv.CreateRevision == ev.Kv.ModRevision:
			created++
			s.orders++
			s.takeParts(ev.Kv)
		}
		s.rev = max(s.rev, ev.Kv.ModRevision)
	}
	s.ordersW.add(now, created)
}

// takeParts takes a new order's parts off the segments it was sold from,
// unless their units were known exactly at or after its revision (a
// counter written in the same transaction already counts it). A record
// that does not decode is left to status and audit to report.
func (s *saleState) takeParts(kv *mvccpb.KeyValue) {
	o, err := segments.DecodeOrder(string(kv.Key), kv.Value)
	if err != nil {
		return
	}
	for _, p := range o.Parts {
		if i := p.Place.Index(); !p.Place.IsPool() && i < len(s.counter) && kv.CreateRevision > s.counterRev[i] {
			s.counter[i] -= p.Qty
		}
	}
}

// applyLocks applies events under the SKU's lock prefix.
func (s *saleState) applyLocks(evs []*clientv3.Event) {
	for _, ev := range evs {
		if ev.Type == mvccpb.DELETE {
			if k, err := s.keys.ParseStockLock(string(ev.Kv.Key)); err == nil {
				delete(s.locks[k.Index], k.Lease)
			}
		} else {
			s.putLockKey(ev.Kv)
		}
		s.rev = max(s.rev, ev.Kv.ModRevision)
	}
}

func (s *saleState) putLockKey(kv *mvccpb.KeyValue) {
	k, err := s.keys.ParseStockLock(string(kv.Key))
	if err != nil || k.SKU != s.sku {
		return
	}
	if s.locks[k.Index] == nil {
		s.locks[k.Index] = map[int64]int64{}
	}
	s.locks[k.Index][k.Lease] = kv.CreateRevision
	if len(kv.Value) > 0 {
		s.idents[k.Lease] = string(kv.Value)
	}
}

// applyElection applies events under the rebalancer's election prefix.
func (s *saleState) applyElection(evs []*clientv3.Event) {
	for _, ev := range evs {
		if ev.Type == mvccpb.DELETE {
			delete(s.candidates, string(ev.Kv.Key))
		} else {
			s.putCandidate(ev.Kv)
		}
		s.rev = max(s.rev, ev.Kv.ModRevision)
	}
}

func (s *saleState) putCandidate(kv *mvccpb.KeyValue) {
	key := string(kv.Key)
	c := candidate{createRev: kv.CreateRevision, identity: string(kv.Value)}
	if hex, ok := strings.CutPrefix(key, s.electionPrefix()); ok {
		c.lease, _ = strconv.ParseInt(hex, 16, 64)
	}
	s.candidates[key] = c
}

// applyLastPass applies an event of the rebalancer's last-pass record.
func (s *saleState) applyLastPass(evs []*clientv3.Event) error {
	for _, ev := range evs {
		s.rev = max(s.rev, ev.Kv.ModRevision)
		if ev.Type == mvccpb.DELETE {
			s.pass = nil
			continue
		}
		p, err := segments.DecodeRebalancePass(string(ev.Kv.Key), ev.Kv.Value)
		if err != nil {
			return err
		}
		s.pass = &p
	}
	return nil
}

// leader is the elected rebalancer: the oldest candidate.
func (s *saleState) leader() (candidate, bool) {
	var best candidate
	for _, c := range s.candidates {
		if best.createRev == 0 || c.createRev < best.createRev {
			best = c
		}
	}
	return best, best.createRev != 0
}

// holder is the lease holding place's lock (the oldest waiter key) and how
// many other sessions wait for it; lease 0 when nobody holds it.
func (s *saleState) holder(place int) (lease int64, waiting int) {
	var oldest int64
	for l, rev := range s.locks[place] {
		if oldest == 0 || rev < oldest {
			lease, oldest = l, rev
		}
	}
	return lease, max(len(s.locks[place])-1, 0)
}

func (s *saleState) remaining(i int) int64 { return s.counter[i] + s.inbox[i] }

// observeFull raises the bar scale to the largest segment. It never comes
// down, so that bars shrink as a sale goes on instead of being redrawn
// against a shrinking scale.
func (s *saleState) observeFull() {
	for i := range s.counter {
		s.full = max(s.full, s.remaining(i))
	}
}

// rateWindow counts events over the last watchRateWindow.
type rateWindow struct {
	marks []rateMark // oldest first
}

type rateMark struct {
	at time.Time
	n  int
}

func (w *rateWindow) add(at time.Time, n int) {
	if n > 0 {
		w.marks = append(w.marks, rateMark{at: at, n: n})
	}
}

// rate is the events per second over the window ending at now. In the
// first seconds of a watch (since started) the window is that long, and
// at least a second, so that one early burst does not read as a huge rate.
func (w *rateWindow) rate(now, started time.Time) float64 {
	from := now.Add(-watchRateWindow)
	drop := 0
	for drop < len(w.marks) && !w.marks[drop].at.After(from) {
		drop++
	}
	w.marks = w.marks[drop:]
	n := 0
	for _, m := range w.marks {
		n += m.n
	}
	span := max(min(watchRateWindow, now.Sub(started)), time.Second)
	return float64(n) / span.Seconds()
}

// putReservation notes a reservation index key (its value is the
// reservation's units).
func (s *saleState) putReservation(kv *mvccpb.KeyValue) error {
	q, err := segments.DecodeCounter(string(kv.Key), kv.Value)
	if err != nil {
		return err
	}
	s.reservations[string(kv.Key)] = q
	s.sawReservations = true
	return nil
}

// reserved is what live reservations hold.
func (s *saleState) reserved() int64 {
	var n int64
	for _, q := range s.reservations {
		n += q
	}
	return n
}

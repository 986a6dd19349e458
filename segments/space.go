package segments

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The space guard. etcd refuses every write once its database reaches its
// quota (--quota-backend-bytes, alarm NOSPACE), and compaction cannot
// free the space live keys take: order records (one key each, and lazy
// segments write little else) stay until prune archives them, and prune
// itself needs a write to start. So new orders are refused a little
// before the quota, while releases, cancels, confirms, the sweep, prune
// and the operator's other writes still have room: recovery is prune,
// then reclaim, without the alarm (docs/operations.md).

// SpaceLowError refuses a new order because etcd's database is over the
// space guard's share of its quota. It matches rpctypes.ErrNoSpace
// (coordinator.ErrNoSpace): nothing was written, and a retry of the order
// under its ID is served once prune has made room. A retry of an order
// that was applied is answered as before (a replay), guard or not.
type SpaceLowError struct {
	// Size is the largest database of the cluster's members that answered,
	// in bytes, and Quota that member's quota.
	Size, Quota int64
	// Fraction is the guard's share of the quota (WithSpaceGuard).
	Fraction float64
	// Endpoint is the member it was read from.
	Endpoint string
}

func (e *SpaceLowError) Error() string {
	return fmt.Sprintf("new orders refused: etcd's database (%s) is %.1f MiB, %.0f%% of its %.1f MiB quota, over the space guard's %.0f%%, "+
		"which keeps room for releases, confirms and prune before etcd's own NOSPACE",
		e.Endpoint, mib(e.Size), 100*float64(e.Size)/float64(e.Quota), mib(e.Quota), 100*e.Fraction)
}

// Unwrap makes the error match rpctypes.ErrNoSpace.
func (e *SpaceLowError) Unwrap() error { return rpctypes.ErrNoSpace }

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// Space guard timing: the database's size is read at most once a
// spaceCheckEvery, sooner when it grows fast enough to reach the line
// before then (a quarter of the time the last growth rate would take, but
// not more often than spaceCheckMin), and for at most spaceCheckWait (a
// member that does not answer in time is passed over: the guard never
// blocks an order longer than that, and etcd's own quota still holds).
const (
	spaceCheckEvery = 100 * time.Millisecond
	spaceCheckMin   = 10 * time.Millisecond
	spaceCheckWait  = time.Second
	spaceCheckIdle  = 30 * time.Second
)

// spaceGuard is the engine's last reading of its etcd's database size.
type spaceGuard struct {
	mu      sync.Mutex
	first   chan struct{} // closed once the first reading is made; nil before it starts
	at      time.Time
	share   float64       // of the quota, at the last reading
	rate    float64       // its growth a second, as last seen
	every   time.Duration // until the next reading
	low     *SpaceLowError
	reading bool // a reading is under way

	// The orders' fast path, without mu: the last reading's refusal (nil:
	// none) and when the next reading is due (Unix nanoseconds; 0 before
	// the first reading).
	lowNow atomic.Pointer[SpaceLowError]
	due    atomic.Int64
}

// spaceLow returns the guard's refusal if the database is over the
// guard's line, as last read. The first call reads it and every call
// waits for that first reading (up to spaceCheckWait, or ctx); later calls
// start a new reading in the background when the last one is older than
// the interval, and answer from the last one.
func (e *Engine) spaceLow(ctx context.Context) error {
	if e.cfg.SpaceGuard <= 0 {
		return nil
	}
	g := &e.space
	if due := g.due.Load(); due != 0 && time.Now().UnixNano() < due {
		if low := g.lowNow.Load(); low != nil {
			return low
		}
		return nil
	}
	g.mu.Lock()
	switch first := g.first; {
	case first == nil:
		g.first, g.reading = make(chan struct{}), true
		g.mu.Unlock()
		e.readSpace(ctx)
		g.mu.Lock()
	case !isClosed(first):
		g.mu.Unlock()
		select {
		case <-first:
		case <-ctx.Done():
		case <-time.After(spaceCheckWait):
		}
		g.mu.Lock()
	case !g.reading && time.Since(g.at) >= g.every:
		g.reading = true
		e.bg.Go(func(ctx context.Context) { e.readSpace(ctx) })
	}
	defer g.mu.Unlock()
	if g.low != nil {
		return g.low
	}
	return nil
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// readSpace reads every endpoint's database size and quota (etcd 3.6 and
// later report the quota; members that do not are passed over) and
// records the largest share.
func (e *Engine) readSpace(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, spaceCheckWait)
	defer cancel()
	var worst *SpaceLowError
	share := 0.0
	answered := false
	for _, ep := range e.client.Endpoints() {
		st, err := e.client.Status(ctx, ep)
		if err != nil {
			continue
		}
		answered = true
		if st.DbSizeQuota <= 0 {
			continue
		}
		if s := float64(st.DbSize) / float64(st.DbSizeQuota); s >= share {
			share = s
			worst = &SpaceLowError{Size: st.DbSize, Quota: st.DbSizeQuota, Fraction: e.cfg.SpaceGuard, Endpoint: ep}
		}
	}
	g := &e.space
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	read := isClosed(g.first)
	if read && share > g.share {
		// The file grows in steps: two readings close together often
		// see one size, and the rate seen last stays until it moves.
		g.rate = (share - g.share) / now.Sub(g.at).Seconds()
	}
	g.every = spaceCheckEvery
	if left := e.cfg.SpaceGuard - share; g.rate > 0 && left > 0 {
		g.every = max(spaceCheckMin, min(spaceCheckEvery, time.Duration(left/g.rate/4*float64(time.Second))))
	} else if g.rate > 0 {
		g.every = spaceCheckMin
	}
	if answered && worst == nil {
		// No member reports a quota (etcd before 3.6): nothing to guard;
		// look again now and then (a member may be upgraded).
		g.every = spaceCheckIdle
	}
	if !read {
		close(g.first)
	}
	g.at, g.share, g.reading = now, share, false
	g.low = nil
	if worst != nil && share >= e.cfg.SpaceGuard {
		g.low = worst
	}
	g.lowNow.Store(g.low)
	g.due.Store(now.Add(g.every).UnixNano()) // after lowNow: the fast path reads them in the other order
}

// guardNewOrder refuses order of sku with the guard's error when the
// database is over the line, unless the order has a record already (a
// retry: it is answered as before, by the commit's replay).
func (e *Engine) guardNewOrder(ctx context.Context, sku, order string) error {
	low := e.spaceLow(ctx)
	if low == nil {
		return nil
	}
	resp, err := e.kv.Get(ctx, e.keys.Order(sku, order), clientv3.WithCountOnly())
	if err != nil {
		return low // cannot tell: refused, nothing written
	}
	if resp.Count > 0 {
		return nil
	}
	return low
}

// The space reserve. A database whose quota live keys fill (order records
// that prune has not archived yet, which is most of what a sale writes)
// leaves compaction nothing to free: after `stockctl reclaim` it is still
// at its quota, and etcd refuses even prune's first write, so the space
// guard's recovery cannot start when the guard was off or could not see
// the quota (etcd before 3.6). The reserve is room set aside for that
// moment: a key of SpaceReserveBytes that each engine's first CreateSKU
// writes if it is absent (in a transaction of its own) and that reclaim
// deletes (a delete passes under NOSPACE) before it compacts and
// defragments, so that the database comes out that much under its quota
// and prune can start. Reclaim writes it again once the database has
// room for it to spare (RestoreSpaceReserve).

// SpaceReserveBytes is the size of the space reserve's value.
const SpaceReserveBytes = 64 << 10

// spaceReserveValue is the reserve's value: a line that says what it is,
// padded to SpaceReserveBytes.
var spaceReserveValue = func() string {
	head := "stockctl space reserve: room that `stockctl reclaim` frees when etcd's database is full (NOSPACE), so that prune can start; see docs/operations.md\n"
	b := make([]byte, SpaceReserveBytes)
	copy(b, head)
	for i := len(head); i < len(b); i++ {
		b[i] = '.'
	}
	return string(b)
}()

// ensureSpaceReserve writes the space reserve if it is absent, once in
// the engine's life (its first CreateSKU): a read, and the write only
// where there is none, so that the reserve's value crosses the network
// and etcd's log once per key space rather than once per SKU. A failure
// is left for the next engine: the reserve is room for a recovery, not
// part of the books.
func (e *Engine) ensureSpaceReserve(ctx context.Context) {
	if !e.reserveChecked.CompareAndSwap(false, true) {
		return
	}
	resp, err := e.kv.Get(ctx, e.keys.SpaceReserve(), clientv3.WithCountOnly())
	if err != nil || resp.Count > 0 {
		return
	}
	_, _ = e.RestoreSpaceReserve(ctx)
}

// ReleaseSpaceReserve deletes the space reserve, so that the next
// compaction and defragmentation leave its room free under the quota. It
// reports the bytes it released (0: there was no reserve). A delete is
// taken under NOSPACE.
func (e *Engine) ReleaseSpaceReserve(ctx context.Context) (int64, error) {
	resp, err := e.kv.Delete(ctx, e.keys.SpaceReserve(), clientv3.WithPrevKV())
	if err != nil {
		return 0, fmt.Errorf("release the space reserve: %w", err)
	}
	var n int64
	for _, kv := range resp.PrevKvs {
		n += int64(len(kv.Value))
	}
	return n, nil
}

// RestoreSpaceReserve writes the space reserve if it is absent, and
// reports whether it wrote it.
func (e *Engine) RestoreSpaceReserve(ctx context.Context) (bool, error) {
	k := e.keys.SpaceReserve()
	resp, err := e.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, spaceReserveValue)).Commit()
	if err != nil {
		return false, fmt.Errorf("restore the space reserve: %w", err)
	}
	return resp.Succeeded, nil
}

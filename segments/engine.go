package segments

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/batch"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/internal/lock"
	"github.com/stockctl/stockctl/internal/seats"
)

// Config is what an Engine needs to know. The coordinator fills it from its
// options, and documents each value's default and cost there.
type Config struct {
	Keys keys.Space
	// LazySegments sells direct orders lazily (SegmentCounter): a process
	// owns the segment it sells a SKU's direct orders from, and each
	// order writes only its record. Off, every direct commit writes the
	// segment's counter too. The coordinator turns it on unless
	// coordinator.WithEagerSegments (coordinator.WithLazySegments says how).
	LazySegments bool
	// SeatAtStart claims the process's seller seat (internal/seats) when
	// the engine is made, rather than at its first direct order: a SKU
	// created from then on is born with this process's home segment named
	// to it (CreateSKU), and its first order there writes only its record.
	// See coordinator.WithSellerSeat.
	SeatAtStart bool
	// SpaceGuard is the share of etcd's quota over which new orders are
	// refused (SpaceLowError); 0 turns the guard off. See
	// coordinator.WithSpaceGuard.
	SpaceGuard float64
	// FallbackWait is how long an order waits for each other place's lock
	// when its own segments cannot serve it.
	FallbackWait time.Duration
	// ClaimWait, with 4 × TenureMaxHold, bounds how long a process below
	// its fair share queues in the background for another process's segment.
	ClaimWait time.Duration
	// TenureMaxHold bounds how long a process keeps a segment another
	// process waits for.
	TenureMaxHold time.Duration
	// SellerIdle: a SKU's seller unused this long, holding no segment, is
	// evicted with its caches (0: never).
	SellerIdle time.Duration
	// MaxTxnOps is etcd's --max-txn-ops.
	MaxTxnOps int
	// CommitTimeout bounds one group commit's round trips.
	CommitTimeout time.Duration
	Logger        *slog.Logger
	// Metrics, if not nil, counts orders, returns, commits and moves.
	Metrics *Metrics
}

// Engine is the segment engine behind a coordinator's stock operations: it
// sells orders from the segments this process holds, falls back to the rest
// of the SKU, commits orders in groups, moves stock, returns and expires
// orders, and reads the books. Service developers use it through
// coordinator.Coordinator, which builds one per process; the rebalance
// package reaches the moves and expiry through the coordinator too.
type Engine struct {
	client  *clientv3.Client
	kv      clientv3.KV // through etcdcall: no caller's deadline reaches etcd
	keys    keys.Space
	locks   *lock.Engine
	bg      *background.Group
	cfg     Config
	log     *slog.Logger
	metrics *Metrics
	// nestUntil: until then (unix nanoseconds) commits of several groups
	// go nested (sendGroups), after one sent flat was refused.
	nestUntil atomic.Int64
	// space is the space guard's last reading (space.go).
	space spaceGuard
	// reserveChecked: the space reserve was looked for (space.go).
	reserveChecked atomic.Bool
	// settling holds the SKUs whose stale lazy segments are being settled
	// (settleStale): one settle of a SKU at a time.
	settling sync.Map
	// owner names this process in the segment counters it owns for lazy
	// direct sales (SegmentCounter.Owner): random, never 0, new with each
	// engine. It needs no lease: the ownership is fenced by the counter's
	// ModRevision, not by the process's liveness.
	owner int64
	// seat spreads this process's direct orders of a SKU away from other
	// processes' (directHome); claimed from its first order that picks a
	// direct segment on (awaitSeat).
	seat *seats.Seat
	// seatWait is how long such an order waits for the first claim
	// (firstSeatWait; tests that need the seat in place wait longer).
	seatWait time.Duration

	// mu guards the maps. It is never held while taking a placeState's or a
	// seller's mutex.
	mu   sync.Mutex
	skus map[string]*skuInfo
	// ownedOnce holds the SKUs of which this engine has owned a place
	// lazily (adoptDirect); never forgotten, one entry a SKU.
	ownedOnce map[string]struct{}
	places    map[placeID]*placeState
	sellers   map[string]*seller
	reaping   bool // the reaper of idle sellers runs
	// metasLoading is closed when the first read of every SKU's meta ends;
	// metasLoaded says it succeeded (then a miss reads one meta).
	metasLoading chan struct{}
	metasLoaded  bool

	lockWatch *lockWatch

	// held and direct commit orders (committer.go): orders whose step ran
	// under their places' locks, and direct orders (tryDirect).
	held, direct *committer
	users        userCache // buyers' counters (per-user limits), as the committer knows them
	confirms     batch.Batcher[*confirmReq]
	returns      batch.Batcher[*returnReq] // Releases and Cancels (return_batch.go)
	looks        batch.Batcher[*lookReq]
	// lookRereads counts the SKUs whose look needed a second transaction
	// to count their lazy segments (settleLooks).
	lookRereads atomic.Int64
	// lookRecords counts the order records the looks' reads returned
	// (settleLooks): what counting lazy segments cost them.
	lookRecords atomic.Int64
	// looksRead and peeksRead count the looks and the peeks answered
	// (look.go): what a first order of a SKU cost this process in reads.
	looksRead, peeksRead atomic.Int64
	// bornSeeded counts the direct caches seeded without a read, as born
	// homes (bornInto).
	bornSeeded atomic.Int64

	carts   batch.Batcher[*cartReq] // orders of several lines (cartbatch.go)
	decider atomic.Pointer[Decider] // orders over several clusters (across.go)
}

// SeatLease is the lease of this process's direct seller seat
// (internal/seats), 0 when it holds none: a lease of this process besides
// its lock session's.
func (e *Engine) SeatLease() int64 { return e.seat.Lease() }

// NewEngine returns an engine making its calls through kv (the client's KV
// wrapped by etcdcall), holding its locks through locks, and running its
// background work in bg.
func NewEngine(client *clientv3.Client, kv clientv3.KV, locks *lock.Engine, bg *background.Group, cfg Config) *Engine {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Engine{
		owner:     rand.Int64N(math.MaxInt64) + 1,
		client:    client,
		kv:        kv,
		keys:      cfg.Keys,
		locks:     locks,
		bg:        bg,
		cfg:       cfg,
		log:       cfg.Logger,
		metrics:   cfg.Metrics,
		skus:      make(map[string]*skuInfo),
		ownedOnce: make(map[string]struct{}),
		places:    make(map[placeID]*placeState),
		sellers:   make(map[string]*seller),
	}
	ttl := 10 * time.Second // coordinator.DefaultSessionTTL
	if locks != nil {
		ttl = locks.SessionTTL()
	}
	var seatOwner int64 // a lazy engine's seat names its owner (CreateSKU's born homes)
	if cfg.LazySegments {
		seatOwner = e.owner
	}
	e.seat = seats.New(client, cfg.Keys.SellersPrefix(), ttl, bg, e.log, seatOwner)
	e.seatWait = firstSeatWait
	if cfg.SeatAtStart {
		// Its first claim (three round trips), waited for so that a SKU
		// created right after names this process's home; bounded, for an
		// etcd that does not answer (the claim goes on behind).
		e.seat.Start()
		e.seat.Wait(context.Background(), seatAtStartWait)
	}
	e.lockWatch = newLockWatch(e)
	e.held = newCommitter(e, heldPlaceCost)
	e.direct = newCommitter(e, directPlaceCost)
	e.confirms = batch.Batcher[*confirmReq]{Go: bg.Go, Select: e.selectConfirms, Commit: e.commitConfirms,
		Fail: func(r *confirmReq) { r.answer(0, lock.ErrClosed) }}
	e.returns = batch.Batcher[*returnReq]{Go: bg.Go, Select: e.selectReturns, Commit: e.commitReturns,
		Fail: func(r *returnReq) { r.answer(nil, false, lock.ErrClosed) }}
	e.looks = batch.Batcher[*lookReq]{Parallel: lookParallel, Go: bg.Go, Select: e.selectLooks, Commit: e.readLooks,
		Fail: func(r *lookReq) { r.err = lock.ErrClosed; close(r.done) }}
	e.carts = batch.Batcher[*cartReq]{Go: bg.Go, Select: e.selectCarts, Commit: e.commitCarts,
		Fail: func(r *cartReq) { r.answer(nil, lock.ErrClosed, false) }}
	if e.metrics != nil {
		e.metrics.status = e.Status
		e.metrics.bgCtx = bg.Ctx
		e.metrics.log = e.log
	}
	return e
}

// seatAtStartWait bounds how long NewEngine waits for the first claim of
// a seat claimed at start (Config.SeatAtStart). Longer than an order's
// firstSeatWait (250 ms): nothing waits on a coordinator being made, and on
// a loaded machine a claim slower than that would leave the SKUs created
// right after it born without this process's home.
const seatAtStartWait = 5 * time.Second

// Keys is the engine's key space.
func (e *Engine) Keys() keys.Space { return e.keys }

// skuInfo caches what never changes after a SKU is created.
type skuInfo struct {
	name     string
	segments int
	// refillBatch is what an order that finds no stock in this process's
	// segments moves from the pool at once (the policy as first read).
	refillBatch int64
	// perUserLimit is the SKU's per-user limit (0: none), fixed at creation.
	perUserLimit int64
	// lowWatermark is the policy's, as first read (a direct commit settles a
	// lazy segment that falls below it).
	lowWatermark int64
	// created is the meta record's CreateRevision: the SKU's incarnation.
	// A SKU deleted and created again under the same name is another
	// one, with another segment count maybe; every write that moves stock
	// compares it (incarnation), so a process with this stale view fails
	// cleanly and reads again (forgetSKU). 0: not known (no fence).
	created int64
	// seenAt is a revision at which the meta record was read with that
	// CreateRevision (0: not known): a key of the SKU created no later
	// and still there belongs to the incarnation (peekInto).
	seenAt int64
	// fill is the initial fill of a SKU whose meta record, as read, was
	// written by the transaction that wrote the whole fill (Meta.
	// InitialFill), and filledAt that record's ModRevision: the revision
	// of its counters as born (bornInto). 0: not known.
	fill, filledAt int64
	// gone is set once the SKU is known to have been deleted or replaced.
	gone atomic.Bool
	// hotUntil (Unix nanoseconds) is when this process's direct commits
	// may sell the SKU lazily again: a batch that carried hotPlace orders
	// of it sets it hotFor ahead (planDirect).
	hotUntil atomic.Int64
	// lookBase is the oldest base of the lazy segments the SKU's last look
	// found (0: none), and lookBaseAt (Unix nanoseconds) when that look
	// was: a look soon after it reads the records since the base in its
	// own transaction, rather than in a second one (look.go,
	// lookBaseFresh).
	lookBase, lookBaseAt atomic.Int64
}

type placeID struct {
	sku   string
	place Place
}

// sku returns what never changes about a SKU, from the cache or etcd. The
// first miss reads every SKU's meta record at once (up to metaPrefetch of
// them): in a sale of many SKUs, a process's first order of each would
// otherwise cost a read of its own.
func (e *Engine) sku(ctx context.Context, name string) (*skuInfo, error) {
	e.mu.Lock()
	info := e.skus[name]
	loading, loaded := e.metasLoading, e.metasLoaded
	if info == nil && !loaded && loading == nil {
		loading = make(chan struct{})
		e.metasLoading = loading
		e.mu.Unlock()
		e.prefetchMetas(ctx)
		close(loading)
		e.mu.Lock()
		info = e.skus[name]
	} else if info == nil && loading != nil {
		e.mu.Unlock()
		select {
		case <-loading:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		e.mu.Lock()
		info = e.skus[name]
	}
	e.mu.Unlock()
	if info != nil && !info.gone.Load() {
		return info, nil
	}
	meta, kv, rev, err := e.metaKV(ctx, name)
	if err != nil {
		return nil, err
	}
	info = infoOf(name, meta, kv, rev)
	e.mu.Lock()
	e.skus[name] = info
	e.mu.Unlock()
	return info, nil
}

// metaPrefetch bounds the meta records read at once into the SKU cache.
const metaPrefetch = 50_000

// prefetchMetas reads the meta records of every SKU (up to metaPrefetch)
// into the cache; a failure leaves the cache to per-SKU reads.
func (e *Engine) prefetchMetas(ctx context.Context) {
	resp, err := e.kv.Get(ctx, e.keys.MetaPrefix(), clientv3.WithPrefix(), clientv3.WithLimit(metaPrefetch))
	e.mu.Lock()
	defer e.mu.Unlock()
	e.metasLoading = nil
	if err != nil {
		return
	}
	e.metasLoaded = true
	for _, kv := range resp.Kvs {
		name, err := e.keys.ParseMeta(string(kv.Key))
		if err != nil {
			continue
		}
		if m, err := DecodeMeta(string(kv.Key), kv.Value); err == nil && !m.Creating && e.skus[name] == nil {
			e.skus[name] = infoOf(name, m, kv, resp.Header.Revision)
		}
	}
}

// infoOf is the cached view of SKU name's meta record m, read as kv at
// revision seenAt.
func infoOf(name string, m Meta, kv *mvccpb.KeyValue, seenAt int64) *skuInfo {
	info := &skuInfo{name: name, segments: m.Segments, refillBatch: m.RefillBatch, perUserLimit: m.PerUserLimit,
		lowWatermark: m.LowWatermark, created: kv.CreateRevision, seenAt: seenAt}
	if !m.Creating && m.InitialFill > 0 {
		info.fill, info.filledAt = m.InitialFill, kv.ModRevision
	}
	return info
}

// bornCounter is what CreateSKU's fill wrote in segment i's counter of a
// SKU whose fill is known (info.fill), when it named owner its home: the
// segment's share of the fill, owned lazily by owner (fillSegments).
func (info *skuInfo) bornCounter(i int, owner int64) SegmentCounter {
	return SegmentCounter{N: fillShare(info.fill, info.segments, i), Owner: owner}
}

// incarnation is the compare that sku is still the SKU info was read from
// (its meta record created at info.created): nil when that is not known.
func (e *Engine) incarnation(info *skuInfo) []clientv3.Cmp {
	if info == nil || info.created == 0 {
		return nil
	}
	return []clientv3.Cmp{revisionIs(clientv3.CreateRevision(e.keys.Meta(info.name)), info.created)}
}

// skuChanged reads whether info's SKU was deleted or replaced (its meta
// record is gone, or was created again); if so it forgets info and
// returns the error to answer with.
func (e *Engine) skuChanged(ctx context.Context, info *skuInfo) error {
	if info == nil || info.created == 0 {
		return nil
	}
	if info.gone.Load() {
		return skuGoneErr(info, true)
	}
	resp, err := e.kv.Get(ctx, e.keys.Meta(info.name), clientv3.WithKeysOnly())
	if err != nil {
		return nil // cannot tell: the caller goes on as it would
	}
	if len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == info.created {
		return nil
	}
	e.forgetSKU(info)
	return skuGoneErr(info, len(resp.Kvs) == 0)
}

func skuGoneErr(info *skuInfo, deleted bool) error {
	if deleted {
		return fmt.Errorf("%w: %s was deleted while the request ran; nothing was written", ErrUnknownSKU, info.name)
	}
	return fmt.Errorf("%w: %s was deleted and created again while the request ran; nothing was written: retry it", ErrConflict, info.name)
}

// forgetSKU drops info, a view of a SKU that was deleted or replaced: the
// next request reads the SKU again. Its seller, if any, stays until it is
// idle (the reaper closes it) but no new request reaches it.
func (e *Engine) forgetSKU(info *skuInfo) {
	info.gone.Store(true)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.skus[info.name] == info {
		delete(e.skus, info.name)
	}
	if s := e.sellers[info.name]; s != nil && s.sku.created == info.created {
		delete(e.sellers, info.name)
		e.sellers[info.name+"\x00"+strconv.FormatInt(info.created, 10)] = s
	}
}

// Meta reads sku's meta record and its mod revision. A SKU still being
// created is ErrUnknownSKU.
func (e *Engine) Meta(ctx context.Context, sku string) (Meta, int64, error) {
	meta, kv, _, err := e.metaKV(ctx, sku)
	if err != nil {
		return Meta{}, 0, err
	}
	return meta, kv.ModRevision, nil
}

// metaKV is Meta with the record's key-value (its revisions) and the
// revision it was read at.
func (e *Engine) metaKV(ctx context.Context, sku string) (Meta, *mvccpb.KeyValue, int64, error) {
	if err := ValidateSKU(sku); err != nil {
		return Meta{}, nil, 0, err
	}
	key := e.keys.Meta(sku)
	resp, err := e.kv.Get(ctx, key)
	if err != nil {
		return Meta{}, nil, 0, fmt.Errorf("read meta of %s: %w", sku, err)
	}
	if len(resp.Kvs) == 0 {
		return Meta{}, nil, 0, ErrUnknownSKU
	}
	meta, err := DecodeMeta(key, resp.Kvs[0].Value)
	if err != nil {
		return Meta{}, nil, 0, err
	}
	if meta.Creating {
		return Meta{}, nil, 0, fmt.Errorf("%w: its creation has not completed", ErrUnknownSKU)
	}
	return meta, resp.Kvs[0], resp.Header.Revision, nil
}

// SKUs lists the SKUs whose creation has completed, in name order.
func (e *Engine) SKUs(ctx context.Context) ([]string, error) {
	resp, err := e.kv.Get(ctx, e.keys.MetaPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list SKUs: %w", err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		name, err := e.keys.ParseMeta(string(kv.Key))
		if err != nil {
			continue
		}
		if m, err := DecodeMeta(string(kv.Key), kv.Value); err == nil && !m.Creating {
			out = append(out, name)
		}
	}
	return out, nil
}

// commitMove sends a move's transaction the way group commits are sent: on
// the engine's own context (ended only by Close), bounded by the commit
// timeout, never on the caller's. A move whose Txn was sent and then
// abandoned might have committed unseen, and its caller (the rebalancer)
// would neither report it nor know the books changed; waiting for the
// answer keeps "an error means nothing moved" true except when etcd itself
// cannot be reached.
func (e *Engine) commitMove(ctx context.Context, commit func(context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // not sent: nothing moved
	}
	cctx, cancel := context.WithTimeout(e.bg.Ctx(), e.cfg.CommitTimeout)
	defer cancel()
	return commit(cctx)
}

// checkFence reports ErrFenced if the fence compares fail now.
func (e *Engine) checkFence(ctx context.Context, fence []clientv3.Cmp) error {
	if len(fence) == 0 {
		return nil
	}
	resp, err := e.kv.Txn(ctx).If(fence...).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return ErrFenced
	}
	return nil
}

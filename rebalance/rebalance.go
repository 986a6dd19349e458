package rebalance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/etcdcall"
	"github.com/stockctl/stockctl/segments"
)

// Defaults of Config.
const (
	// DefaultSweepInterval is how often the leader reads a slice of the
	// SKUs again (64 of them, going round): watches make refills prompt;
	// the sweep only bounds how long a missed event can delay one (one
	// interval for up to 64 SKUs, a few seconds for thousands).
	DefaultSweepInterval = time.Second
	// DefaultIdleAfter is how long a segment's stock must stay unchanged
	// before consolidation counts the segment as receiving no traffic.
	DefaultIdleAfter = 2 * time.Second
	// DefaultDrainWait is how long a drain waits for a segment's lock; a
	// segment busy for longer is not idle and is left alone.
	DefaultDrainWait = 20 * time.Millisecond
)

// MoveKind says which way a move went.
type MoveKind int

const (
	// Refill moved stock from the pool into a segment.
	Refill MoveKind = iota + 1
	// Drain moved a segment's stock back to the pool.
	Drain
)

func (k MoveKind) String() string {
	switch k {
	case Refill:
		return "refill"
	case Drain:
		return "drain"
	}
	return "unknown"
}

// Move is one committed transfer.
type Move struct {
	SKU     string
	Segment int
	Kind    MoveKind
	Qty     int64
	// Revision is the revision that committed the move.
	Revision int64
	// TriggerRevision is, for a refill, the revision of the change that took
	// the segment below its watermark (0 when found by a sweep).
	TriggerRevision int64
	// Latency is, for a refill, the time from this rebalancer seeing the
	// crossing to the move's commit.
	Latency time.Duration
	Leader  string
}

// Pass summarises one round of decisions by a leader.
type Pass struct {
	Leader   string
	Moves    []Move
	Revision int64
	// Expired are the reservations the pass expired (RunOnce; Run reports
	// them through Config.OnExpire).
	Expired []segments.Expiry
}

// Config configures a Rebalancer. The zero value uses the defaults.
type Config struct {
	// Identity names this rebalancer in the leadership record and in
	// status; default "<hostname>/<pid>".
	Identity string
	// SweepInterval: see DefaultSweepInterval.
	SweepInterval time.Duration
	// IdleAfter: see DefaultIdleAfter.
	IdleAfter time.Duration
	// DrainWait: see DefaultDrainWait.
	DrainWait time.Duration
	// Logger receives leadership changes and failed moves (default: discarded).
	Logger *slog.Logger
	// OnMove, if set, is called after each committed move, from the
	// rebalancer's goroutine: keep it quick.
	OnMove func(Move)
	// ExpiryPoll: see DefaultExpiryPoll.
	ExpiryPoll time.Duration
	// OnExpire, if set, is called after each reservation the leader
	// expired, from the sweeping goroutines: keep it quick, and safe for
	// concurrent use.
	OnExpire func(segments.Expiry)
}

// Rebalancer runs the policy while elected.
type Rebalancer struct {
	c      deps
	cfg    Config
	log    *slog.Logger
	leader atomic.Bool
	// watching: leading, every SKU read and acted on once (Watching).
	watching atomic.Bool
	metrics  *rebalancerMetrics

	mu           sync.Mutex
	totalMoves   int
	totalMoved   int64
	totalExpired int
}

// New returns a rebalancer acting through c. It does nothing until Run or
// RunOnce.
//
// A rebalancer is elected in one etcd cluster and moves the stock of that
// cluster's SKUs, its every move fenced by its leadership there. For a
// coordinator over several clusters (coordinator.NewClusters) make one per
// cluster, on c.Cluster(name) (New refuses the fleet's coordinator itself).
func New(c *coordinator.Coordinator, cfg Config) (*Rebalancer, error) {
	if c == nil {
		return nil, fmt.Errorf("rebalance: coordinator is nil: %w", coordinator.ErrInvalidArgument)
	}
	if cs := c.Clusters(); cs != nil {
		return nil, fmt.Errorf("rebalance: %w: the coordinator spans clusters %v: make one rebalancer per cluster, on c.Cluster(name)",
			coordinator.ErrInvalidArgument, cs)
	}
	if cfg.SweepInterval < 0 || cfg.IdleAfter < 0 || cfg.DrainWait < 0 || cfg.ExpiryPoll < 0 {
		return nil, fmt.Errorf("rebalance: %w: intervals must not be negative", coordinator.ErrInvalidArgument)
	}
	if cfg.Identity == "" {
		host, _ := os.Hostname()
		cfg.Identity = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	if cfg.IdleAfter == 0 {
		cfg.IdleAfter = DefaultIdleAfter
	}
	if cfg.DrainWait == 0 {
		cfg.DrainWait = DefaultDrainWait
	}
	if cfg.ExpiryPoll == 0 {
		cfg.ExpiryPoll = DefaultExpiryPoll
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Rebalancer{c: newDeps(c), cfg: cfg, log: log, metrics: newRebalancerMetrics(cfg.Identity)}, nil
}

// Identity is the name this rebalancer campaigns with.
func (r *Rebalancer) Identity() string { return r.cfg.Identity }

// Leader reports whether this rebalancer is the elected one right now.
func (r *Rebalancer) Leader() bool { return r.leader.Load() }

// Watching reports whether this rebalancer leads and its term's first
// pass is done: it has read every SKU's counters (one range of the whole
// stock: over 10,000 SKUs of 20 segments, some 220,000 keys), acted on
// each SKU it read, and from then on acts on each change as etcd reports
// it. A newly elected leader is not yet watching; until it is, a SKU the
// pass has not reached waits for its refills (over 10,000 SKUs whose
// segments all start below their watermark, the pass takes about a minute
// on a 2-core machine). Exported as the stockctl_rebalancer_watching
// gauge.
func (r *Rebalancer) Watching() bool { return r.watching.Load() }

// Run campaigns for leadership and, while elected, keeps every SKU's
// segments stocked; when leadership is lost (its session ended) it
// campaigns again. It returns when ctx ends, after resigning. Errors other
// than ctx's end are logged and retried after a pause.
func (r *Rebalancer) Run(ctx context.Context) error {
	for {
		err := r.term(ctx, func(ctx context.Context, l *leadership) error { return r.lead(ctx, l) })
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, coordinator.ErrSessionLost) {
			r.log.Warn("rebalancer term ended", "err", err)
		}
		if !background.Sleep(ctx, 100*time.Millisecond) {
			return nil
		}
	}
}

// RunOnce campaigns (ctx bounds the wait), makes one pass over sku as the
// leader, records it, and resigns. Consolidation in a single pass counts a
// segment as idle when its lock is free. The pass also expires sku's
// reservations due by now (Pass.Expired).
func (r *Rebalancer) RunOnce(ctx context.Context, sku string) (*Pass, error) {
	var pass *Pass
	err := r.term(ctx, func(ctx context.Context, l *leadership) error {
		v, err := l.load(ctx, sku)
		if err != nil {
			return err
		}
		v.forceIdle = true
		l.refillWait = -1
		pass = &Pass{Leader: r.cfg.Identity}
		xs, err := r.expireSKU(ctx, l, sku)
		pass.Expired = xs
		if err != nil {
			return err
		}
		if err := r.act(ctx, l, v, pass); err != nil {
			return err
		}
		return r.record(ctx, l, pass)
	})
	if err != nil {
		return nil, fmt.Errorf("rebalance %s: %w", sku, err)
	}
	return pass, nil
}

// leadership is one elected term.
type leadership struct {
	c     deps
	sess  *concurrency.Session
	e     *concurrency.Election
	fence clientv3.Cmp
	// refillWait bounds a refill's wait for its pool lock: refillLockWait
	// while leading (Run), none in the one pass an operator asked for
	// (RunOnce: -1, as long as its ctx allows).
	refillWait time.Duration
}

// term wins an election on the coordinator's session, runs f while leader,
// and resigns. f's ctx ends when the session does.
func (r *Rebalancer) term(ctx context.Context, f func(context.Context, *leadership) error) error {
	sess, err := r.c.session(ctx)
	if err != nil {
		return err
	}
	// Campaign keeps waiting after its session expired (etcd issue 19597):
	// bound it by the session too.
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(sess.Ctx(), func() { cancel(coordinator.ErrSessionLost) })
	defer stop()

	e := concurrency.NewElection(sess, r.c.keys.Election())
	// Through etcdcall: the caller's deadline must not reach the server,
	// whose own answer to it would not read as the ctx's end.
	if err := etcdcall.Run(lctx, func(ctx context.Context) error { return e.Campaign(ctx, r.cfg.Identity) }); err != nil {
		if cause := context.Cause(lctx); cause != nil {
			return cause
		}
		return fmt.Errorf("campaign: %w", err)
	}
	l := &leadership{c: r.c, sess: sess, e: e,
		fence:      clientv3.Compare(clientv3.CreateRevision(e.Key()), "=", e.Rev()),
		refillWait: refillLockWait}
	elected := false
	defer func() {
		r.leader.Store(false)
		r.watching.Store(false)
		if elected {
			how := "resigned"
			if isDone(sess.Done()) {
				how = "lost"
			}
			r.metrics.terms.WithLabelValues(how).Inc()
			r.log.Info("rebalancer term ended", "identity", r.cfg.Identity, "how", how)
		}
		if !isDone(sess.Done()) {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := etcdcall.Run(rctx, e.Resign); err != nil {
				r.log.Debug("resign failed; leadership ends with the session", "err", err)
			}
		}
	}()
	// Campaign can return nil after its session expired (the phantom
	// leader): prove leadership in etcd before acting.
	resp, err := r.c.kv.Txn(lctx).If(l.fence).Commit()
	if err != nil {
		return fmt.Errorf("confirm leadership: %w", err)
	}
	if !resp.Succeeded || isDone(sess.Done()) {
		return coordinator.ErrSessionLost
	}
	r.leader.Store(true)
	elected = true
	r.metrics.elections.Inc()
	r.mu.Lock()
	r.totalMoves, r.totalMoved = 0, 0
	r.mu.Unlock()
	r.log.Info("rebalancer elected", "identity", r.cfg.Identity, "lease", fmt.Sprintf("%x", int64(sess.Lease())))
	return f(lctx, l)
}

// record writes the pass where status shows it, fenced by leadership.
func (r *Rebalancer) record(ctx context.Context, l *leadership, p *Pass) error {
	r.mu.Lock()
	for _, m := range p.Moves {
		r.totalMoves++
		r.totalMoved += m.Qty
	}
	rec := segments.RebalancePass{Leader: r.cfg.Identity, At: time.Now().UTC(), Moves: len(p.Moves),
		Revision: p.Revision, TotalMoves: r.totalMoves, TotalMoved: r.totalMoved}
	r.mu.Unlock()
	for _, m := range p.Moves {
		rec.Moved += m.Qty
	}
	resp, err := r.c.kv.Txn(ctx).If(l.fence).
		Then(clientv3.OpPut(r.c.keys.RebalanceLast(), segments.EncodeRebalancePass(rec))).Commit()
	if err != nil {
		return fmt.Errorf("record pass: %w", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("record pass: %w", segments.ErrFenced)
	}
	return nil
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

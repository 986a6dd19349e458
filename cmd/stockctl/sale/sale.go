package sale

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

// Defaults applied by Run to zero Config fields.
const (
	// DefaultMaxDuration bounds a run whose config sets no MaxDuration. A
	// sale normally ends long before, when the stock is sold out.
	DefaultMaxDuration = 5 * time.Minute
	// DefaultStopGrace is how long orders in flight when the run stops
	// (MaxDuration, MaxOrders, MaxErrors) may take to finish before their
	// ctx is cancelled. Cost: a run can last this much longer than
	// MaxDuration; orders cut by the cancel are counted as unresolved.
	DefaultStopGrace = 5 * time.Second
	// DefaultMaxErrors is how many failed attempts (errors other than a
	// refusal) stop the run: with etcd gone, buyers would otherwise spin
	// until MaxDuration.
	DefaultMaxErrors = 100
	// DefaultMaxAttempts is how often an order is tried under its order ID
	// before it is given up as unresolved.
	DefaultMaxAttempts = 3
	// DefaultAttemptTimeout bounds one attempt at an order. Cost: an
	// attempt slower than this counts as an error and is retried under the
	// same order ID (which tells whether it had committed after all).
	DefaultAttemptTimeout = 10 * time.Second
	// DefaultProgressInterval is how often Config.Progress is called.
	DefaultProgressInterval = 200 * time.Millisecond
)

// retryBackoff is the pause before the second attempt at an order; it
// doubles for each further attempt.
const retryBackoff = 10 * time.Millisecond

// ErrInvalidConfig is returned (wrapped, naming the field) by Run for a
// config it cannot run.
var ErrInvalidConfig = errors.New("sale: invalid config")

// Buy places one order for qty units on behalf of buyer, with the given
// order ID and route key. It is called concurrently from all buyers. An
// error wrapping coordinator.ErrInsufficientStock is a refusal; any other
// error is a failed attempt, and the same order is tried again (so Buy must
// be idempotent by order ID, as coordinator.Allocate is).
type Buy func(ctx context.Context, buyer int, order string, qty int64, routeKey string) (*coordinator.Allocation, error)

// Config describes a sale.
type Config struct {
	// Buyers is the number of concurrent buyers (goroutines), at least 1.
	Buyers int
	// Buy places one order.
	Buy Buy
	// MinQty and MaxQty bound each order's quantity, drawn uniformly from
	// [MinQty, MaxQty]; 1 ≤ MinQty ≤ MaxQty.
	MinQty, MaxQty int64
	// MaxDuration bounds the run: no order starts after it, and orders in
	// flight get StopGrace to finish. 0 means DefaultMaxDuration.
	MaxDuration time.Duration
	// StopGrace: see DefaultStopGrace. 0 means the default.
	StopGrace time.Duration
	// MaxOrders bounds how many orders (distinct order IDs) are placed in
	// all; 0 means no bound.
	MaxOrders int64
	// MaxErrors stops the run after this many failed attempts; 0 means
	// DefaultMaxErrors, a negative value no bound.
	MaxErrors int64
	// MaxAttempts bounds the attempts at one order; 0 means
	// DefaultMaxAttempts.
	MaxAttempts int
	// AttemptTimeout bounds each attempt (each call of Buy); 0 means
	// DefaultAttemptTimeout.
	AttemptTimeout time.Duration
	// Progress, if set, is called from one goroutine: once as the run
	// starts (however short the run, a watcher sees it begin), every
	// ProgressInterval, and once more when the run ends (with Done set).
	Progress func(Progress)
	// ProgressInterval: 0 means DefaultProgressInterval.
	ProgressInterval time.Duration
	// Seed makes the quantities reproducible; 0 picks a random seed.
	Seed uint64
	// OrderPrefix starts every order ID ("<prefix>-<buyer>-<n>"). The
	// default is "sale-" and a random hex string, so that runs against the
	// same etcd never reuse an order ID.
	OrderPrefix string
	// RouteKey returns the route key of a buyer; default "user-<buyer>".
	RouteKey func(buyer int) string
}

// StopReason says why a run ended.
type StopReason string

// Why a run ended.
const (
	StopSoldOut     StopReason = "sold out"     // every buyer was told the SKU is sold out
	StopMaxOrders   StopReason = "max orders"   // Config.MaxOrders orders were placed
	StopMaxDuration StopReason = "max duration" // Config.MaxDuration passed
	StopMaxErrors   StopReason = "max errors"   // Config.MaxErrors attempts failed
	StopCancelled   StopReason = "cancelled"    // the caller's ctx ended
)

// Result is the outcome of a run.
type Result struct {
	Stop StopReason
	// SoldOut is true when every buyer stopped because it was told the SKU
	// is sold out.
	SoldOut bool
	// Orders is the number of orders served; Units the sum of their
	// quantities: exactly what the run took from the stock, since every
	// order ID is unique and retries replay rather than deduct twice.
	Orders int64
	Units  int64
	// Refusals counts insufficient-stock answers.
	Refusals int64
	// Errors counts attempts that failed otherwise; FirstError is the first.
	Errors     int64
	FirstError error
	// Replayed counts orders served by a retry that found an earlier
	// attempt had already committed them.
	Replayed int64
	// Unresolved counts orders whose outcome is unknown: every attempt
	// failed, or the run's stop cut them off. They may or may not have
	// taken stock.
	Unresolved int64
	// Elapsed is the run's wall time, until the last buyer stopped.
	Elapsed time.Duration
	// Selling is the time from the start to the last served order. After
	// a sell-out, Elapsed − Selling is how long it took to tell every
	// buyer so.
	Selling time.Duration
	// OrdersPerSec and UnitsPerSec are rates over Selling: the pace while
	// there was stock to sell.
	OrdersPerSec float64
	UnitsPerSec  float64
	// Latency of served orders, from their first attempt to success,
	// computed exactly (nearest rank) from all samples.
	P50, P90, P99, Max time.Duration
	// Latencies are all samples, sorted.
	Latencies []time.Duration
	// MinPerBuyer and MaxPerBuyer are the fewest and most orders one buyer
	// was served: how fairly the stock was shared.
	MinPerBuyer, MaxPerBuyer int64
}

// run is the shared state of one Run.
type run struct {
	cfg   Config
	start time.Time

	orders, units, refusals, errs, replayed, unresolved atomic.Int64
	lastServed                                          atomic.Int64 // time.Since(start) of the last served order, ns
	placed                                              atomic.Int64 // order IDs handed out (MaxOrders)
	active                                              atomic.Int64

	// stopping is closed at the soft stop: no order starts after it.
	stopping chan struct{}
	stopOnce sync.Once
	stopWhy  StopReason // written once, before stopping is closed

	mu       sync.Mutex
	firstErr error
}

// Run runs a sale until every buyer is told the SKU is sold out, or a bound
// of cfg is reached, or ctx ends. It returns what happened; the error is
// ErrInvalidConfig (with a nil result) or, when ctx ended first, ctx's cause
// (with the result so far). Hitting a bound of cfg is not an error: see
// Result.Stop.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	r := &run{cfg: cfg, stopping: make(chan struct{}), start: time.Now()}

	// runCtx is what buys see. It ends StopGrace after the soft stop, so
	// that orders in flight can finish but nothing runs on unbounded.
	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	softTimer := time.AfterFunc(cfg.MaxDuration, func() { r.stop(StopMaxDuration) })
	defer softTimer.Stop()
	stopWatch := context.AfterFunc(ctx, func() { r.stop(StopCancelled) })
	defer stopWatch()
	go func() {
		select {
		case <-r.stopping:
		case <-runCtx.Done():
			return
		}
		t := time.NewTimer(cfg.StopGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancelRun(fmt.Errorf("sale stopped (%s) and orders in flight did not finish within %v", r.stopWhy, cfg.StopGrace))
		case <-runCtx.Done():
		}
	}()

	results := make([]buyerResult, cfg.Buyers)
	var wg sync.WaitGroup
	r.active.Store(int64(cfg.Buyers))
	for i := range cfg.Buyers {
		wg.Go(func() {
			defer r.active.Add(-1)
			results[i] = r.buyer(runCtx, i)
		})
	}
	allDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(allDone)
	}()
	r.report(allDone)
	elapsed := time.Since(r.start)

	res := r.result(results, elapsed)
	if ctx.Err() != nil {
		return res, context.Cause(ctx)
	}
	return res, nil
}

func (cfg *Config) setDefaults() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case cfg.Buyers < 1:
		return bad("buyers %d: must be at least 1", cfg.Buyers)
	case cfg.Buy == nil:
		return bad("Buy is nil")
	case cfg.MinQty < 1 || cfg.MaxQty < cfg.MinQty || cfg.MaxQty > segments.MaxQty:
		return bad("quantities %d to %d: want 1 ≤ min ≤ max ≤ %d", cfg.MinQty, cfg.MaxQty, segments.MaxQty)
	case cfg.MaxDuration < 0 || cfg.StopGrace < 0 || cfg.ProgressInterval < 0 || cfg.AttemptTimeout < 0:
		return bad("durations must not be negative")
	case cfg.MaxOrders < 0:
		return bad("max orders %d: must not be negative", cfg.MaxOrders)
	case cfg.MaxAttempts < 0:
		return bad("max attempts %d: must not be negative", cfg.MaxAttempts)
	}
	if cfg.MaxDuration == 0 {
		cfg.MaxDuration = DefaultMaxDuration
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = DefaultStopGrace
	}
	if cfg.MaxErrors == 0 {
		cfg.MaxErrors = DefaultMaxErrors
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = DefaultAttemptTimeout
	}
	if cfg.ProgressInterval == 0 {
		cfg.ProgressInterval = DefaultProgressInterval
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	if cfg.OrderPrefix == "" {
		cfg.OrderPrefix = fmt.Sprintf("sale-%016x", rand.Uint64())
	}
	// The longest ID this run can produce must be a valid order ID.
	if err := segments.ValidateOrderID(orderID(cfg.OrderPrefix, cfg.Buyers, 1<<62)); err != nil {
		return bad("order prefix %q: %v", cfg.OrderPrefix, err)
	}
	if cfg.RouteKey == nil {
		cfg.RouteKey = func(buyer int) string { return fmt.Sprintf("user-%d", buyer) }
	}
	return nil
}

func orderID(prefix string, buyer int, n int64) string {
	return fmt.Sprintf("%s-%d-%d", prefix, buyer, n)
}

// stop makes the soft stop: no new orders. The first reason wins.
func (r *run) stop(why StopReason) {
	r.stopOnce.Do(func() {
		r.stopWhy = why
		close(r.stopping)
	})
}

func (r *run) stopped() bool {
	select {
	case <-r.stopping:
		return true
	default:
		return false
	}
}

func (r *run) noteError(err error) {
	n := r.errs.Add(1)
	r.mu.Lock()
	if r.firstErr == nil {
		r.firstErr = err
	}
	r.mu.Unlock()
	if r.cfg.MaxErrors > 0 && n >= r.cfg.MaxErrors {
		r.stop(StopMaxErrors)
	}
}

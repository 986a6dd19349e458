package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stockctl/stockctl/internal/background"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Strategy is one way of selling a hot SKU, set up for one run. Run calls
// Setup once, then Buy concurrently from every buyer, then Verify, then
// Teardown (also after a failed Setup).
type Strategy interface {
	// Setup creates the run's stock: p.Stock units, spread as the strategy
	// does (per segment, in a pool, in one key).
	Setup(ctx context.Context, p Params) error
	// Buy takes qty units for an order, running p.Step while holding the
	// lock (for strategies that have a step), and records the order under
	// its ID. Buying an order ID again must not take stock again: it
	// returns replayed true. A refusal for lack of stock wraps
	// coordinator.ErrInsufficientStock. ctx bounds the call.
	Buy(ctx context.Context, buyer int, order string, qty int64, routeKey string) (replayed bool, err error)
	// Verify reads the books after the run.
	Verify(ctx context.Context) (Books, error)
	// Teardown releases what Setup made (sessions, clients, keys).
	Teardown(ctx context.Context) error
}

// refillReporter is a Strategy that observes its refills (stockctl's, with
// a RefillObserver). Run asks it after Verify.
type refillReporter interface {
	Refills() RefillResult
}

// Spec describes a strategy and makes fresh instances of it.
type Spec struct {
	// Name is the short name used by --strategies and in the table.
	Name string
	// Title says in a few words what the strategy is.
	Title string
	// Step is true when each order runs the business step while holding
	// its lock; false for pure allocation (no step, no ideal).
	Step bool
	// OneKey is true when every order goes through one lock or key
	// whatever the segment count: its ideal is 1/step.
	OneKey bool
	// New makes an instance for one run.
	New func() Strategy
}

// places is how many orders the strategy can serve at once with n segments:
// the numerator of its ideal rate.
func (s Spec) places(n int) int {
	if s.OneKey {
		return 1
	}
	return n
}

// Params is what a strategy is set up with for one run.
type Params struct {
	// Run names the run; strategies keep their keys under a prefix made of
	// it, so that runs never see each other's data.
	Run string
	// Segments is the segment count (places for strategies that are not
	// OneKey).
	Segments int
	// Buyers is the number of concurrent buyers; buyer b calls Buy with
	// buyer = b.
	Buyers int
	// Processes is how many "processes" (etcd clients, coordinators, Redis
	// clients) the buyers are spread over; Process(b) is buyer b's.
	Processes int
	// Affinity says how buyers are placed in processes (see Process).
	Affinity Affinity
	// Units is the most units the run can take (its order cap times the
	// largest quantity). A strategy puts at least this much in every place
	// that has no fallback (any one segment could take all of it), and at
	// least this much in all for one that moves stock between places, so
	// that the run never sells out: it measures a hot SKU in full sale.
	Units int64
	// Step is the business step, run while the order's lock is held; nil
	// for pure-allocation strategies. Its ctx must end when the lock is
	// known to be lost.
	Step func(ctx context.Context, buyer int) error
	// Etcd is the etcd the run uses: one client per process, shared by the
	// etcd-based strategies (each makes its own sessions on them).
	Etcd []*clientv3.Client
	// Prefix is the etcd key prefix of this run's keys.
	Prefix string
}

// Affinity is how buyers are placed in processes.
type Affinity string

const (
	// Spread puts the buyers of one segment (b, b+N, b+2N…) in different
	// processes as far as there are processes, as requests for one hot
	// segment arrive at different servers behind a plain load balancer.
	// Every handoff of a segment's lock then goes from one process to
	// another through etcd.
	Spread Affinity = "spread"
	// SegmentAffinity puts all the buyers of one segment in the same
	// process (segment mod processes), as a load balancer that routes users
	// by the same hash as the segments would: handoffs of a segment's lock
	// stay inside one process.
	SegmentAffinity Affinity = "segment"
)

// Process is buyer b's process, as p.Affinity places it.
func (p Params) Process(b int) int {
	n, procs := max(p.Segments, 1), max(p.Processes, 1)
	if p.Affinity == SegmentAffinity {
		return (b % n) % procs
	}
	return (b + b/n) % procs
}

// Books is a strategy's account of a run, read after it.
type Books struct {
	// Stock is what the strategy put on sale.
	Stock int64 `json:"stock"`
	// Remaining is what its counters still hold (their sum, negative
	// counters included).
	Remaining int64 `json:"remaining"`
	// Negative is the sum of the magnitudes of counters below zero:
	// units handed out that were not there.
	Negative int64 `json:"negative"`
	// Sold is the sum of the quantities of the order records; Orders
	// counts them.
	Sold   int64 `json:"sold"`
	Orders int64 `json:"orders"`
	// Problems says what the strategy's own audit found wrong.
	Problems []string `json:"problems"`
}

// Oversold is the units sold beyond the stock: orders recorded that the
// counters do not account for (Sold + Remaining > Stock, a lost update),
// plus counters below zero.
func (b Books) Oversold() int64 {
	return max(0, b.Sold+b.Remaining-b.Stock) + b.Negative
}

// ErrUnknownStrategy is returned (wrapped, naming it) for a strategy name
// that is not available.
var ErrUnknownStrategy = errors.New("bench: unknown strategy")

// ErrNoRedis is returned by RedisSpecs when this binary was built without
// the Redis peers (they live in the benchredis module).
var ErrNoRedis = errors.New("bench: built without the Redis peers")

// redisPeers is the constructor registered by the benchredis module.
var redisPeers struct {
	mu  sync.Mutex
	new func(addr string) ([]Spec, error)
}

// RegisterRedis makes the Redis peers available to RedisSpecs. The
// benchredis module calls it from its binary's main, so that the Redis client
// libraries stay out of the main module.
func RegisterRedis(f func(addr string) ([]Spec, error)) {
	redisPeers.mu.Lock()
	defer redisPeers.mu.Unlock()
	redisPeers.new = f
}

// RedisSpecs returns the Redis peers' strategies against the Redis server
// at addr, or ErrNoRedis.
func RedisSpecs(addr string) ([]Spec, error) {
	redisPeers.mu.Lock()
	f := redisPeers.new
	redisPeers.mu.Unlock()
	if f == nil {
		return nil, ErrNoRedis
	}
	return f(addr)
}

// Select returns the specs named in names (all of specs when names is
// empty), in the order of specs.
func Select(specs []Spec, names []string) ([]Spec, error) {
	if len(names) == 0 {
		return specs, nil
	}
	var known []string
	for _, s := range specs {
		known = append(known, s.Name)
	}
	for _, n := range names {
		if !slices.Contains(known, n) {
			return nil, fmt.Errorf("%w %q (available: %s)", ErrUnknownStrategy, n, strings.Join(known, ", "))
		}
	}
	var out []Spec
	for _, s := range specs {
		if slices.Contains(names, s.Name) {
			out = append(out, s)
		}
	}
	return out, nil
}

// sleepStep is a business step of d: it returns when d has passed, or
// ctx's cause when ctx ends first.
func sleepStep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if !background.Sleep(ctx, d) {
		return context.Cause(ctx)
	}
	return nil
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/cmd/stockctl/sale"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

// Defaults of a bench run. Each is what the matching Config field gets
// when zero.
const (
	// DefaultStep is the business step, as in the seed: a 20 ms critical
	// section makes one lock 50 orders/s and 20 segments 1,000.
	DefaultStep = 20 * time.Millisecond
	// DefaultDuration bounds each strategy's run at one shape.
	// Cost: runs × (this + setup + draining the orders in flight).
	DefaultDuration = 5 * time.Second
	// DefaultOrders caps the orders of each run; stock is sized so that a
	// run never sells out.
	DefaultOrders = 100_000
	// DefaultBuyersPerSegment: with B closed-loop buyers, Little's law
	// makes end-to-end latency at least B / throughput. Two buyers per
	// segment keep every segment busy (one in its step, one waiting) at
	// an end-to-end latency of about two steps.
	DefaultBuyersPerSegment = 2
	// MaxDefaultBuyers caps the default buyer count.
	MaxDefaultBuyers = 400
	// DefaultProcesses is how many "processes" (etcd clients and
	// coordinators, Redis clients) the buyers are spread over.
	DefaultProcesses = 4
	// DefaultStopGrace is how long orders in flight at the end of a run may
	// take to finish. One lock with 200 buyers queued needs 200 steps (4 s)
	// to drain; orders cut off are counted as unresolved.
	DefaultStopGrace = 5 * time.Second
	// DefaultAttemptTimeout bounds one attempt at an order (then it is
	// retried under the same order ID).
	DefaultAttemptTimeout = 10 * time.Second
	// DefaultSetupTimeout bounds a strategy's Setup, Verify and Teardown.
	DefaultSetupTimeout = time.Minute
)

// ErrInvalidConfig is returned (wrapped, naming the field) by Run for a
// config it cannot run.
var ErrInvalidConfig = errors.New("bench: invalid config")

// Config describes a bench run.
type Config struct {
	// Specs are the strategies to run, each at every shape.
	Specs []Spec
	// Shapes are the segment and buyer counts to run each strategy at.
	// Shapes of one segment count run next to each other, in the order
	// the segment counts first appear; no shape may appear twice.
	Shapes []Shape
	// Step is the business step of the strategies that have one.
	Step time.Duration
	// Duration and Orders bound each run.
	Duration time.Duration
	Orders   int64
	// Processes is how many processes the buyers are spread over; Etcd
	// has one client per process (the etcd strategies need it).
	Processes int
	Etcd      []*clientv3.Client
	// Affinity places buyers in processes; "" means Spread.
	Affinity Affinity
	// Prefix is the etcd key prefix under which every run gets a prefix of
	// its own; everything under it is deleted after each run.
	Prefix         string
	StopGrace      time.Duration
	AttemptTimeout time.Duration
	SetupTimeout   time.Duration
	// Progress, if set, is called from one goroutine while a run goes on.
	Progress func(Progress)
}

// Shape is the segment and buyer counts of a run.
type Shape struct {
	Segments int `json:"segments"`
	// Buyers is the number of concurrent buyers; 0 means BuyersFor(Segments).
	Buyers int `json:"buyers"`
}

// String writes the shape as SEGMENTSxBUYERS, as stockctl bench --runs
// takes it.
func (s Shape) String() string { return fmt.Sprintf("%dx%d", s.Segments, s.Buyers) }

// Progress is a view of a bench run in progress.
type Progress struct {
	Run, Runs int // this run's number (from 1) and how many there are
	Strategy  string
	Segments  int
	Buyers    int
	sale.Progress
}

func (cfg *Config) setDefaults() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if cfg.Step == 0 {
		cfg.Step = DefaultStep
	}
	if cfg.Duration == 0 {
		cfg.Duration = DefaultDuration
	}
	if cfg.Orders == 0 {
		cfg.Orders = DefaultOrders
	}
	if cfg.Processes == 0 {
		cfg.Processes = DefaultProcesses
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = DefaultStopGrace
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = DefaultAttemptTimeout
	}
	if cfg.SetupTimeout == 0 {
		cfg.SetupTimeout = DefaultSetupTimeout
	}
	if cfg.Affinity == "" {
		cfg.Affinity = Spread
	}
	switch {
	case len(cfg.Specs) == 0:
		return bad("no strategies")
	case len(cfg.Shapes) == 0:
		return bad("no shapes")
	case cfg.Step < 0 || cfg.Duration < 0 || cfg.StopGrace < 0 || cfg.AttemptTimeout < 0 || cfg.SetupTimeout < 0:
		return bad("durations must not be negative")
	case cfg.Orders < 0:
		return bad("orders %d: must not be negative", cfg.Orders)
	case cfg.Processes < 1:
		return bad("processes %d: must be at least 1", cfg.Processes)
	case len(cfg.Etcd) < cfg.Processes:
		return bad("%d etcd clients for %d processes", len(cfg.Etcd), cfg.Processes)
	case cfg.Prefix == "":
		return bad("empty prefix")
	case cfg.Affinity != Spread && cfg.Affinity != SegmentAffinity:
		return bad("affinity %q: want %s or %s", cfg.Affinity, Spread, SegmentAffinity)
	}
	for _, sh := range cfg.Shapes {
		if sh.Segments < 1 || sh.Segments > segments.MaxSegments {
			return bad("shape %v: segments must be between 1 and %d", sh, segments.MaxSegments)
		}
		if sh.Buyers < 0 {
			return bad("shape %v: buyers must not be negative", sh)
		}
	}
	cfg.Shapes = RunOrder(cfg.Shapes)
	for i, sh := range cfg.Shapes {
		if slices.Contains(cfg.Shapes[:i], sh) {
			return bad("shape %v appears twice", sh)
		}
	}
	return nil
}

// RunOrder returns shapes as Run runs them, in a new slice: default buyer
// counts resolved, and the shapes of one segment count next to each other
// (segment counts in the order they first appear, shapes of one count in
// their given order).
func RunOrder(shapes []Shape) []Shape {
	out := make([]Shape, 0, len(shapes))
	for i, sh := range shapes {
		if slices.ContainsFunc(shapes[:i], func(o Shape) bool { return o.Segments == sh.Segments }) {
			continue // already placed with the first of its count
		}
		for _, o := range shapes[i:] {
			if o.Segments == sh.Segments {
				if o.Buyers == 0 {
					o.Buyers = BuyersFor(o.Segments)
				}
				out = append(out, o)
			}
		}
	}
	return out
}

// BuyersFor is the default buyer count at n segments.
func BuyersFor(n int) int {
	return min(max(DefaultBuyersPerSegment*n, 2), MaxDefaultBuyers)
}

// Run runs every strategy of cfg at every shape, one after the other, and
// returns a row per run. A run that fails to set up or ends in an error
// still gets its row (with the error); Run goes on with the next. The error
// is ErrInvalidConfig, or ctx's cause when ctx ended (with the rows so far).
func Run(ctx context.Context, cfg Config) ([]Row, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	runs := len(cfg.Specs) * len(cfg.Shapes)
	var rows []Row
	// Shapes outside, strategies inside: the strategies compared at one
	// shape run close together in time, under the same background load
	// (and the shapes of one segment count are next to each other).
	for _, sh := range cfg.Shapes {
		for _, spec := range cfg.Specs {
			if ctx.Err() != nil {
				return rows, context.Cause(ctx)
			}
			rows = append(rows, runOne(ctx, &cfg, spec, sh, len(rows)+1, runs))
		}
	}
	return rows, context.Cause(ctx)
}

// runOne runs spec at shape sh (its buyer count resolved).
func runOne(ctx context.Context, cfg *Config, spec Spec, sh Shape, num, runs int) (row Row) {
	n, buyers := sh.Segments, sh.Buyers
	row = Row{Strategy: spec.Name, Title: spec.Title, Segments: n, Places: spec.places(n), Buyers: buyers, Problems: []string{}}
	if spec.Step {
		row.StepMs = ms(cfg.Step)
		row.IdealPerSec = float64(row.Places) / cfg.Step.Seconds()
	}
	fail := func(format string, args ...any) Row {
		row.Problems = append(row.Problems, fmt.Sprintf(format, args...))
		return row
	}
	routes, err := evenRouteKeys(buyers, n)
	if err != nil {
		return fail("%v", err)
	}
	id := fmt.Sprintf("%s-%dx%d-%08x", spec.Name, n, buyers, rand.Uint32())
	// The step records when each buyer's order started holding its lock
	// (the service time runs from there to the order's return).
	stepStart := make([]atomic.Int64, buyers)
	p := Params{Run: id, Segments: n, Buyers: buyers, Processes: cfg.Processes, Affinity: cfg.Affinity, Units: cfg.Orders, Etcd: cfg.Etcd[:cfg.Processes],
		Prefix: cfg.Prefix + id + "/"}
	if spec.Step {
		p.Step = func(ctx context.Context, buyer int) error {
			stepStart[buyer].Store(time.Now().UnixNano())
			return sleepStep(ctx, cfg.Step)
		}
	}
	s := spec.New()
	sctx, cancel := context.WithTimeout(ctx, cfg.SetupTimeout)
	defer cancel()
	defer func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.SetupTimeout)
		defer cancel()
		if err := s.Teardown(tctx); err != nil {
			row.Problems = append(row.Problems, "teardown: "+err.Error())
			row.OK = false
		}
	}()
	if err := s.Setup(sctx, p); err != nil {
		return fail("setup: %v", err)
	}
	cancel()

	service := make([][]time.Duration, buyers) // each buyer appends to its own
	buy := func(ctx context.Context, buyer int, order string, qty int64, routeKey string) (*coordinator.Allocation, error) {
		stepStart[buyer].Store(0)
		replayed, err := s.Buy(ctx, buyer, order, qty, routeKey)
		if err != nil {
			return nil, err
		}
		if t := stepStart[buyer].Load(); t != 0 && !replayed {
			service[buyer] = append(service[buyer], time.Since(time.Unix(0, t)))
		}
		return &coordinator.Allocation{SKU: benchSKU, Order: order, Qty: qty, Replayed: replayed}, nil
	}
	var progress func(sale.Progress)
	if cfg.Progress != nil {
		progress = func(sp sale.Progress) {
			cfg.Progress(Progress{Run: num, Runs: runs, Strategy: spec.Name, Segments: n, Buyers: buyers, Progress: sp})
		}
	}
	cpu0 := runCPU(s)
	res, saleErr := sale.Run(ctx, sale.Config{
		Buyers: buyers, Buy: buy, MinQty: 1, MaxQty: 1,
		MaxDuration: cfg.Duration, MaxOrders: cfg.Orders, StopGrace: cfg.StopGrace,
		AttemptTimeout: cfg.AttemptTimeout, MaxErrors: 2 * int64(buyers),
		OrderPrefix: "o-" + id, RouteKey: func(b int) string { return routes[b] },
		Progress: progress,
	})
	cpu := runCPU(s) - cpu0
	if res == nil {
		return fail("run: %v", saleErr)
	}
	if res.Orders > 0 && cpu > 0 {
		row.CPUMicrosPerOrder = float64(cpu.Microseconds()) / float64(res.Orders)
	}
	var all []time.Duration
	for _, s := range service {
		all = append(all, s...)
	}
	slices.Sort(all)
	row.fill(res, all)
	if saleErr != nil {
		row.Problems = append(row.Problems, "run: "+saleErr.Error())
	}

	vctx, vcancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.SetupTimeout)
	defer vcancel()
	books, err := s.Verify(vctx)
	if err != nil {
		return fail("verify: %v", err)
	}
	row.check(res, books)
	if rr, ok := s.(refillReporter); ok {
		row.refills(rr.Refills())
	}
	return row
}

// cpuReporter is a strategy whose work runs partly in other processes
// (stockctl-api's serve processes): the CPU time they have used.
type cpuReporter interface{ ProcessCPU() time.Duration }

// runCPU is the CPU time used so far by this process (the buyers, the
// in-process coordinators, the embedded etcd) and by s's processes.
func runCPU(s Strategy) time.Duration {
	cpu := selfCPU()
	if r, ok := s.(cpuReporter); ok {
		cpu += r.ProcessCPU()
	}
	return cpu
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

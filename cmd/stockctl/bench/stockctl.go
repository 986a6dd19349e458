package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/stockctl/stockctl/coordinator"
)

// leaderWait bounds the wait for the rebalancer's election before a run
// starts (the run starts anyway: the segments hold stock).
const leaderWait = 10 * time.Second

// benchSKU is the SKU every stockctl run creates under its own prefix.
const benchSKU = "hot"

// Stockctl is this project: the segmented coordinator, one per process,
// each order running the business step in AllocateFunc while its segment's
// lock is held, with a rebalancer refilling the segments from a pool that
// holds most of the stock.
func Stockctl() Spec {
	return Spec{Name: "stockctl", Title: "stockctl segments + rebalancer + pool, AllocateFunc", Step: true,
		New: func() Strategy { return &stockctl{} }}
}

// StockctlNoStep is this project with no business step: Allocate, where
// concurrent requests for one place are committed together (group commit).
// Pure allocation throughput; there is no ideal.
func StockctlNoStep() Spec {
	return Spec{Name: "stockctl-nostep", Title: "stockctl Allocate, no step (group commit)",
		New: func() Strategy { return &stockctl{} }}
}

// StockctlReserve is this project's checkout flow with no business step:
// Reserve (the units held for reserveTTL), then Confirm (the payment), two
// commits per order. Throughput of the reservation lifecycle; there is no
// ideal.
func StockctlReserve() Spec {
	return Spec{Name: "stockctl-reserve", Title: "stockctl Reserve then Confirm, no step",
		New: func() Strategy { return &stockctl{reserve: true} }}
}

// reserveTTL is the bench's reservation TTL: longer than any run, so that
// no reservation expires before its Confirm.
const reserveTTL = time.Hour

type stockctl struct {
	p Params
	fleet
	// refills times the refills of the run, from Setup to Verify.
	refills *RefillObserver
	// reserve: Buy reserves then confirms (StockctlReserve).
	reserve bool
}

// warnCounter is a slog handler that counts records at Warn and above and
// keeps the first.
type warnCounter struct {
	mu    sync.Mutex
	n     int
	first string
}

func (w *warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnCounter) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnCounter) WithGroup(string) slog.Handler                { return w }

func (w *warnCounter) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == 0 {
		w.first = r.Message
		r.Attrs(func(a slog.Attr) bool { w.first += " " + a.String(); return true })
	}
	w.n++
	return nil
}

func (w *warnCounter) problem() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == 0 {
		return ""
	}
	return fmt.Sprintf("rebalancer: %d warnings (first: %s)", w.n, w.first)
}

// SKU shape: most of the stock in the pool (see Setup).
const (
	// initialFillShare is the share of the total that starts in the
	// segments without a step; the rest is in the pool.
	initialFillShare = 10
	// With a step, each segment starts with one refill batch, and is
	// refilled with another once it holds less than the low watermark:
	// at 50 orders/s a segment crosses about once a second.
	saleRefillBatch  = 50
	saleLowWatermark = 20
)

func (s *stockctl) Setup(ctx context.Context, p Params) error {
	s.p = p
	if err := s.open(p.Etcd, p.Processes, p.Prefix); err != nil {
		return err
	}
	var err error
	cfg := skuConfig(p)
	if _, err := s.coords[0].CreateSKU(ctx, benchSKU, cfg); err != nil {
		return fmt.Errorf("create the SKU: %w", err)
	}
	// Before the rebalancer starts and the buyers buy: every crossing of
	// the watermark is seen.
	if s.refills, err = ObserveRefills(ctx, p.Etcd[0], p.Prefix, benchSKU, p.Segments, cfg.LowWatermark); err != nil {
		return fmt.Errorf("observe refills: %w", err)
	}
	r, err := s.startRebalancer(ctx)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(leaderWait)
	for !r.Leader() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	return context.Cause(ctx)
}

// skuConfig is the run's SKU. A quarter more than the run can take, so
// that it never sells out. With a step, the SKU is stocked as a sale is: a
// few batches in each segment and the rest in the pool, so that segments
// keep running low and the rebalancer (and the sellers' pulls) keep them
// stocked during the run; the refill figures measure that. Pure allocation
// sells tens of thousands a second: a tenth of the stock starts in the
// segments and refills are a quarter of an even share, so that its figure
// is the allocations', not the refills'.
func skuConfig(p Params) coordinator.SKUConfig {
	total := p.Units + p.Units/4 + int64(p.Segments)
	cfg := coordinator.SKUConfig{Total: total, Segments: p.Segments}
	if p.Step != nil {
		cfg.RefillBatch, cfg.LowWatermark = saleRefillBatch, saleLowWatermark
		cfg.InitialFill = min(total, int64(p.Segments)*saleRefillBatch)
		return cfg
	}
	return noStepConfig(total, p.Segments)
}

// noStepConfig stocks a SKU for throughput rather than refills: a tenth of
// the stock in the segments, refill batch total/(4×segments), low
// watermark half of it.
func noStepConfig(total int64, segments int) coordinator.SKUConfig {
	cfg := coordinator.SKUConfig{Total: total, Segments: segments, InitialFill: total / initialFillShare,
		RefillBatch: coordinator.DefaultRefillBatch(total, segments)}
	cfg.LowWatermark = max(1, cfg.RefillBatch/2)
	return cfg
}

// Coordinators are the run's coordinators, one per process (for probes).
func (s *stockctl) Coordinators() []*coordinator.Coordinator { return s.coords }

func (s *stockctl) Buy(ctx context.Context, buyer int, order string, qty int64, routeKey string) (bool, error) {
	c := s.coords[s.p.Process(buyer)]
	var a *coordinator.Allocation
	var err error
	switch {
	case s.reserve:
		if a, err = c.Reserve(ctx, benchSKU, order, qty, routeKey, reserveTTL); err == nil {
			// A replayed reservation may have been confirmed already:
			// Confirm replays that too.
			_, err = c.Confirm(ctx, benchSKU, order)
		}
	case s.p.Step != nil:
		a, err = c.AllocateFunc(ctx, benchSKU, order, qty, routeKey, func(ctx context.Context) error { return s.p.Step(ctx, buyer) })
	default:
		a, err = c.Allocate(ctx, benchSKU, order, qty, routeKey)
	}
	if err != nil {
		return false, err
	}
	return a.Replayed, nil
}

// Refills is what the run's refill observer saw, up to Verify.
func (s *stockctl) Refills() RefillResult {
	if s.refills == nil {
		return RefillResult{Err: errors.New("not observed")}
	}
	return s.refills.Stop()
}

func (s *stockctl) Verify(ctx context.Context) (Books, error) {
	if s.refills != nil {
		s.refills.Stop() // the sale is over: what follows is not under it
	}
	if s.stop != nil {
		s.stop() // the books must not move while they are read
	}
	a, err := s.coords[0].Audit(ctx, benchSKU)
	if err != nil {
		return Books{}, err
	}
	b := Books{Stock: a.Total, Remaining: a.Pool + a.Segments, Sold: a.Allocated, Orders: a.Orders, Problems: a.Problems}
	if p := s.rebFailures.problem(); p != "" {
		b.Problems = append(b.Problems, p)
	}
	if !a.OK && len(b.Problems) == 0 {
		b.Problems = []string{"the audit failed"}
	}
	return b, nil
}

func (s *stockctl) Teardown(ctx context.Context) error {
	if s.refills != nil {
		s.refills.Stop()
	}
	return s.close(ctx, s.p.Etcd, s.p.Prefix)
}

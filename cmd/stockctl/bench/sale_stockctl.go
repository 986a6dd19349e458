package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/segments"
)

// StockctlSale is this project in a sale shape: one coordinator per
// process, plain Allocate of 1 unit (no business step), the elected
// rebalancer running in a process of its own, every SKU stocked as the
// lock shapes' pure allocation is (a tenth in the segments, the rest in the
// pool).
func StockctlSale() SaleSpec {
	return SaleSpec{Name: "stockctl", Title: "stockctl Allocate, no step", New: func() SaleStrategy { return &stockctlSale{} }}
}

// StockctlEagerSale is StockctlSale with coordinator.WithEagerSegments:
// the direct orders of SKUs a process holds no segment of write their
// segment's counter with their records, as stockctl's default did before
// lazy segments (StockctlSale's rows) became it.
func StockctlEagerSale() SaleSpec {
	return SaleSpec{Name: "stockctl-eager", Title: "stockctl Allocate, no step, eager segments", New: func() SaleStrategy {
		return &stockctlSale{fleet: fleet{opts: []coordinator.Option{coordinator.WithEagerSegments()}}}
	}}
}

// setupWorkers is how many SKUs are created (and audited) at once.
const setupWorkers = 16

type stockctlSale struct {
	p SaleParams
	fleet
}

func (s *stockctlSale) Setup(ctx context.Context, p SaleParams) error {
	s.p = p
	if err := s.open(p.Etcd, p.Processes, p.Prefix); err != nil {
		return err
	}
	cfg := noStepConfig(p.Shape.Stock, p.Segments)
	if err := forEachSKU(ctx, p.Shape.SKUs, func(i int) error {
		_, err := s.coords[0].CreateSKU(ctx, SKUName(i), cfg)
		return err
	}); err != nil {
		return fmt.Errorf("create the SKUs: %w", err)
	}
	_, err := s.startRebalancer(ctx)
	return err
}

// Prepare readies every process for every SKU (Coordinator.Prepare), the
// processes at once.
func (s *stockctlSale) Prepare(ctx context.Context) error {
	names := make([]string, s.p.Shape.SKUs)
	for i := range names {
		names[i] = SKUName(i)
	}
	errs := make([]error, len(s.coords))
	var wg sync.WaitGroup
	for i, c := range s.coords {
		wg.Go(func() {
			_, errs[i] = c.Prepare(ctx, names...)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// forEachSKU calls f for SKUs 0 to n-1, setupWorkers at a time; the first
// error stops it.
func forEachSKU(ctx context.Context, n int, f func(i int) error) error {
	work := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range min(setupWorkers, n) {
		wg.Go(func() {
			for i := range work {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		mu.Lock()
		stop := first != nil
		mu.Unlock()
		if stop || ctx.Err() != nil {
			break
		}
		work <- i
	}
	close(work)
	wg.Wait()
	if first != nil {
		return first
	}
	return context.Cause(ctx)
}

func (s *stockctlSale) Order(ctx context.Context, process, sku int, order string) (OrderOutcome, error) {
	_, err := s.coords[process].Allocate(ctx, SKUName(sku), order, 1, "")
	if err == nil {
		return OrderOutcome{Served: true}, nil
	}
	// Declared here, not above: errors.As makes it escape, and a served
	// order then paid a heap allocation for it (a CPU profile of 'one').
	var refused *coordinator.InsufficientStockError
	if errors.As(err, &refused) {
		return OrderOutcome{Revision: refused.Revision, Remaining: refused.Remaining}, nil
	}
	return OrderOutcome{}, err
}

// OrderCart takes 1 unit of each of skus in one order (AllocateOrder).
func (s *stockctlSale) OrderCart(ctx context.Context, process int, skus []int, order string) (OrderOutcome, error) {
	lines := make([]coordinator.Line, len(skus))
	for i, k := range skus {
		lines[i] = coordinator.Line{SKU: SKUName(k), Qty: 1}
	}
	_, err := s.coords[process].AllocateOrder(ctx, order, lines)
	var line *coordinator.LineError
	var refused *coordinator.InsufficientStockError
	switch {
	case err == nil:
		return OrderOutcome{Served: true}, nil
	case errors.As(err, &line) && errors.As(err, &refused):
		return OrderOutcome{Line: line.Index, Revision: refused.Revision, Remaining: refused.Remaining}, nil
	}
	return OrderOutcome{}, err
}

func (s *stockctlSale) Release(ctx context.Context, process, sku int, order string) error {
	_, err := s.coords[process].Release(ctx, SKUName(sku), order)
	return err
}

func (s *stockctlSale) Now(ctx context.Context, process int) (int64, error) {
	resp, err := s.p.Etcd[process].Get(ctx, s.p.Prefix+"bench-now", clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

func (s *stockctlSale) RemainingAt(ctx context.Context, sku int, rev int64) (int64, error) {
	return remainingAt(ctx, s.p.Etcd[0], s.coords[0], sku, rev)
}

// remainingAt is what SKU sku of coordinator c (one cluster's), read on
// cli, held in all at revision rev.
func remainingAt(ctx context.Context, cli *clientv3.Client, c *coordinator.Coordinator, sku int, rev int64) (int64, error) {
	k := engines.Of(c).Keys
	resp, err := cli.Get(ctx, k.SKUStock(SKUName(sku)), clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, kv := range resp.Kvs {
		v, err := segments.DecodeCounter(string(kv.Key), kv.Value)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

func (s *stockctlSale) Verify(ctx context.Context) (SaleBooks, error) {
	if s.stop != nil {
		s.stop() // the books must not move while they are read
	}
	n := s.p.Shape.SKUs
	b := SaleBooks{Sold: make([]int64, n), Stock: make([]int64, n)}
	var mu sync.Mutex
	err := forEachSKU(ctx, n, func(i int) error {
		a, err := s.coords[0].Audit(ctx, SKUName(i))
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		b.Sold[i], b.Stock[i] = a.Allocated, a.Total
		if !a.OK {
			b.Problems = append(b.Problems, fmt.Sprintf("%s: %v", SKUName(i), a.Problems))
		}
		return nil
	})
	if p := s.rebFailures.problem(); p != "" {
		b.Problems = append(b.Problems, p)
	}
	return b, err
}

func (s *stockctlSale) Teardown(ctx context.Context) error {
	return s.close(ctx, s.p.Etcd, s.p.Prefix)
}

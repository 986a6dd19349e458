package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// SaleConfig describes a run of sale shapes.
type SaleConfig struct {
	Specs     []SaleSpec
	Shapes    []SaleShape
	Buyers    int
	Processes int
	Segments  int
	Duration  time.Duration
	// MinOrders: each buyer places at least this many orders, past
	// Duration if it must (tests, whose checks need a buyer's second
	// order whatever the machine's speed); 0 for none.
	MinOrders int
	Etcd      []*clientv3.Client
	Prefix    string
	// AttemptTimeout bounds one attempt at an order (then it is retried
	// under the same ID, up to 3 attempts).
	AttemptTimeout time.Duration
	SetupTimeout   time.Duration
	// TruthSample: one order in this many is checked (0: none).
	TruthSample int
	// Counter, when set, counts the etcd requests of the clients in Etcd
	// (their interceptor): each row reports its run's.
	Counter *EtcdCounter
	// Server, when set, reads etcd's own counters (the etcd of Etcd must
	// be the one in this process): each row reports its selling window's.
	Server *EtcdServerMetrics
	// LimitMaxPuts bounds each physical-limit row's puts (0:
	// LimitMaxPuts).
	LimitMaxPuts int64
	// LimitWriters is the physical-limit rows' writer count (0: one per
	// process, as many as the sale's coordinators); writer i uses process
	// i mod Processes's client.
	LimitWriters int
	// Clusters, when set, are the etcd clusters of the strategies over
	// several (StockctlClustersSale); the others run on Etcd alone.
	Clusters []SaleCluster
}

// SaleRow is one strategy's run at one sale shape.
type SaleRow struct {
	Strategy string    `json:"strategy"`
	Shape    SaleShape `json:"shape"`
	Buyers   int       `json:"buyers"`
	Seconds  float64   `json:"seconds"`
	// PrepareSeconds is how long the processes took to prepare every SKU
	// before the window (shapes with Prepare), outside Seconds.
	PrepareSeconds float64 `json:"prepareSeconds,omitempty"`
	// Orders were served; OrdersPerSec over the whole run.
	Orders       int64   `json:"orders"`
	OrdersPerSec float64 `json:"ordersPerSec"`
	// LateOrdersPerSec is the rate of orders served in the run's second
	// half (from half its --duration to its end): the sale once its
	// start-up is behind it. Over 10,000 SKUs most orders of a short run
	// are the first a process sells of their SKU (a look at the SKU, and
	// a write of its segment's counter, the takeover); by the second half
	// fewer are.
	LateOrders       int64   `json:"lateOrders"`
	LateOrdersPerSec float64 `json:"lateOrdersPerSec"`
	// Lines are the lines of the served orders (a cart shape's; 0
	// elsewhere): KEYS/LINE divides by them.
	Lines int64 `json:"lines,omitempty"`
	// Refusals; RefusalsPerSec from the first refusal to the end (the
	// storm after a sell-out).
	Refusals       int64   `json:"refusals"`
	RefusalsPerSec float64 `json:"refusalsPerSec"`
	Releases       int64   `json:"releases"`
	ServedMs       Latency `json:"servedMs"`
	RefusalMs      Latency `json:"refusalMs"`
	// Errors are attempts that failed otherwise (each order is retried
	// under its ID); Unresolved orders failed every attempt.
	Errors     int64  `json:"errors"`
	Unresolved int64  `json:"unresolved"`
	FirstError string `json:"firstError,omitempty"`
	// TruthChecked refusals were checked against the books at their
	// revision; Untrue of them were not true at a revision at or after
	// the order's start.
	TruthChecked int `json:"truthChecked"`
	Untrue       int `json:"untrue"`
	// Goroutines and HeapMiB of the whole bench process at the end of the
	// run (its coordinators, etcd and buyers), after a GC. An embedded
	// etcd's in-memory raft log is most of the heap and grows over the
	// rows of one bench run: a later row carries the earlier rows' (one
	// SKU, 3 s: 115-123 MiB as the first row, 248-254 MiB as the second,
	// whichever strategy). Compare rows at the same position.
	Goroutines int     `json:"goroutines"`
	HeapMiB    float64 `json:"heapMiB"`
	// Etcd are the etcd requests the strategy sent during the run (its
	// coordinators and rebalancer, or nothing for a non-etcd strategy),
	// when counted.
	Etcd *EtcdCounts `json:"etcd,omitempty"`
	// EtcdServer are etcd's own counters over the selling window (from
	// the buyers' start to the last answer), every writer included: the
	// coordinators, the rebalancer's moves; when etcd runs in this
	// process, and only for the rows that sell on etcd.
	EtcdServer *EtcdServerCounts `json:"etcdServer,omitempty"`
	// CPUSeconds is the CPU time this process used over the selling
	// window when etcd runs in it (its buyers, coordinators and etcd:
	// everything the sale ran on), else 0.
	CPUSeconds float64 `json:"cpuSeconds,omitempty"`
	// writeBounds are the fewest and the most writes etcd can have
	// applied over the window for the clients' counts (EtcdServer.Writes
	// lies between them when only the counted clients write): the tests'
	// check that the two counts are of the same thing, exact however
	// many writes were in flight at the window's edges.
	writeBounds [2]int64
	// Costs are the figures per served order made from Etcd, EtcdServer
	// and CPUSeconds.
	Costs OrderCosts `json:"costs"`
	// Clusters are each cluster's share of a row run over several
	// clusters (StockctlClustersSale): its SKUs, requests and keys
	// written in the selling window.
	Clusters []ClusterShare `json:"clusters,omitempty"`
	Oversold int64          `json:"oversold"`
	OK       bool           `json:"ok"`
	Problems []string       `json:"problems"`
}

// RunSale runs every sale strategy at every shape (shapes outside, so that
// the strategies compared at one shape run close in time).
func RunSale(ctx context.Context, cfg SaleConfig) ([]SaleRow, error) {
	switch {
	case len(cfg.Specs) == 0 || len(cfg.Shapes) == 0:
		return nil, fmt.Errorf("%w: no sale strategies or shapes", ErrInvalidConfig)
	case cfg.Buyers < 1 || cfg.Processes < 1 || cfg.Segments < 1 || cfg.Duration <= 0:
		return nil, fmt.Errorf("%w: buyers, processes, segments and duration must be positive", ErrInvalidConfig)
	case len(cfg.Etcd) < cfg.Processes:
		return nil, fmt.Errorf("%w: %d etcd clients for %d processes", ErrInvalidConfig, len(cfg.Etcd), cfg.Processes)
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = DefaultAttemptTimeout
	}
	if cfg.SetupTimeout == 0 {
		cfg.SetupTimeout = 5 * DefaultSetupTimeout
	}
	var rows []SaleRow
	for _, sh := range cfg.Shapes {
		if sh.Batch > 0 { // the physical limit: etcd alone, once
			if ctx.Err() != nil {
				return rows, context.Cause(ctx)
			}
			rows = append(rows, runLimitOne(ctx, &cfg, sh))
			continue
		}
		for _, spec := range cfg.Specs {
			if ctx.Err() != nil {
				return rows, context.Cause(ctx)
			}
			if _, carts := spec.New().(CartStrategy); sh.Lines > 1 && !carts {
				continue // a strategy without carts does not run the cart shape
			}
			if _, ok := spec.New().(SalePreparer); sh.Prepare && !ok {
				continue // nor one that cannot prepare a prepared shape
			}
			rows = append(rows, runSaleOne(ctx, &cfg, spec, sh))
		}
	}
	return rows, context.Cause(ctx)
}

// truthSample is a sampled order: the revision before it started, and
// where it was refused.
type truthSample struct {
	sku                 int
	start, rev, remains int64
}

// saleBuyer is what one buyer saw.
type saleBuyer struct {
	served, lines, refusals, releases, errors, unresolved int64
	lateServed                                            int64 // served in the run's second half
	servedLat, refusalLat                                 []time.Duration
	firstRefusal                                          time.Time
	firstErr                                              error
	samples                                               []truthSample
	sold                                                  map[int]int64 // units held by its served, unreleased orders, per SKU
}

func runSaleOne(ctx context.Context, cfg *SaleConfig, spec SaleSpec, sh SaleShape) (row SaleRow) {
	row = SaleRow{Strategy: spec.Name, Shape: sh, Buyers: cfg.Buyers, Problems: []string{}}
	fail := func(format string, args ...any) SaleRow {
		row.Problems = append(row.Problems, fmt.Sprintf(format, args...))
		return row
	}
	id := fmt.Sprintf("%s-%s-%08x", spec.Name, sh.Name, rand.Uint32())
	p := SaleParams{Run: id, Shape: sh, Segments: cfg.Segments, Processes: cfg.Processes, Etcd: cfg.Etcd[:cfg.Processes], Prefix: cfg.Prefix + id + "/"}
	for _, cl := range cfg.Clusters {
		if len(cl.Etcd) < cfg.Processes {
			return fail("cluster %s: %d etcd clients for %d processes", cl.Name, len(cl.Etcd), cfg.Processes)
		}
		p.Clusters = append(p.Clusters, SaleCluster{Name: cl.Name, Etcd: cl.Etcd[:cfg.Processes], Counter: cl.Counter})
	}
	s := spec.New()
	defer func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.SetupTimeout)
		defer cancel()
		if err := s.Teardown(tctx); err != nil {
			row.Problems = append(row.Problems, "teardown: "+err.Error())
			row.OK = false
		}
	}()
	sctx, cancel := context.WithTimeout(ctx, cfg.SetupTimeout)
	err := s.Setup(sctx, p)
	cancel()
	if err != nil {
		return fail("setup: %v", err)
	}
	if sp, ok := s.(SalePreparer); ok && sh.Prepare {
		sctx, cancel := context.WithTimeout(ctx, cfg.SetupTimeout)
		began := time.Now()
		err := sp.Prepare(sctx)
		cancel()
		if err != nil {
			return fail("prepare: %v", err)
		}
		row.PrepareSeconds = time.Since(began).Seconds()
	}
	tc, _ := s.(truthChecker)
	// The truth check: the revision an order starts at, and what its SKU
	// held at the refusal's revision (over clusters: the SKU's cluster's,
	// single-line orders only).
	var nowOf func(ctx context.Context, process, sku int) (int64, error)
	var remainingAt func(ctx context.Context, sku int, rev int64) (int64, error)
	if tc != nil {
		nowOf = func(ctx context.Context, process, _ int) (int64, error) { return tc.Now(ctx, process) }
		remainingAt = tc.RemainingAt
	} else if st, ok := s.(skuTruthChecker); ok && sh.Lines <= 1 {
		nowOf, remainingAt = st.NowOf, st.RemainingAt
	}
	cs, _ := s.(CartStrategy)
	if sh.Lines > 1 && (cs == nil || sh.SKUs < sh.Lines) {
		return fail("carts of %d lines over %d SKUs (strategy with carts: %v)", sh.Lines, sh.SKUs, cs != nil)
	}
	picker := newSKUPicker(sh.SKUs, sh.Skew)
	buyers := make([]saleBuyer, cfg.Buyers)
	cls, _ := s.(*clustersSale)
	w := startWindow(cfg, tc != nil || cls != nil)
	var clStart []clusterWindow
	if cls != nil {
		if clStart, err = startClusters(ctx, p.Clusters, p.Prefix); err != nil {
			return fail("count the clusters: %v", err)
		}
	}
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	half := start.Add(cfg.Duration / 2)
	var wg sync.WaitGroup
	var seq atomic.Int64
	for b := range buyers {
		wg.Go(func() {
			sb := &buyers[b]
			sb.sold = map[int]int64{}
			r := rand.New(rand.NewPCG(uint64(b), rand.Uint64()))
			proc := b % cfg.Processes
			for n := 0; (n < cfg.MinOrders || time.Now().Before(deadline)) && ctx.Err() == nil; n++ {
				sku := picker.pick(r)
				skus := []int{sku}
				lines := sh.Lines
				if sh.CartShare > 0 && sh.CartShare < 1 && r.Float64() >= sh.CartShare {
					lines = 1 // a single order of a cart-mix shape
				}
				for len(skus) < lines {
					if k := picker.pick(r); !slices.Contains(skus, k) {
						skus = append(skus, k)
					}
				}
				order := fmt.Sprintf("o-%s-%d-%d", id, b, n)
				// Only refusals are checked, so only a buyer that has been
				// refused samples (its first refusal is never checked): the
				// read before each sampled order is etcd's work in this
				// process, and in a shape that refuses nothing it was 4 %
				// of the CPU of a 'one' window checking nothing (the Redis
				// rows have no revision to read, and never paid it).
				sample := nowOf != nil && cfg.TruthSample > 0 && sb.refusals > 0 && seq.Add(1)%int64(cfg.TruthSample) == 0
				var startRev int64
				if sample {
					var err error
					if startRev, err = nowOf(Uncounted(ctx), proc, sku); err != nil {
						sample = false
					}
				}
				t0 := time.Now()
				out, ok := saleAttempts(ctx, cfg, sb, func(actx context.Context) (OrderOutcome, error) {
					if lines > 1 {
						return cs.OrderCart(actx, proc, skus, order)
					}
					return s.Order(actx, proc, sku, order)
				})
				lat := time.Since(t0)
				if !out.Served && out.Line > 0 && out.Line < len(skus) {
					sku = skus[out.Line] // the refused line's, for the truth check
				}
				switch {
				case !ok:
					sb.unresolved++
				case out.Served:
					sb.served++
					if t0.Add(lat).After(half) {
						sb.lateServed++
					}
					sb.lines += int64(len(skus))
					for _, k := range skus {
						sb.sold[k]++
					}
					sb.servedLat = append(sb.servedLat, lat)
					if sh.Release > 0 && r.Float64() < sh.Release {
						if _, ok := saleAttempts(ctx, cfg, sb, func(actx context.Context) (OrderOutcome, error) {
							return OrderOutcome{}, s.Release(actx, proc, sku, order)
						}); ok {
							sb.releases++
							sb.sold[sku]--
						}
					}
				default:
					if sb.refusals == 0 {
						sb.firstRefusal = t0
					}
					sb.refusals++
					sb.refusalLat = append(sb.refusalLat, lat)
					if sample {
						sb.samples = append(sb.samples, truthSample{sku: sku, start: startRev, rev: out.Revision, remains: out.Remaining})
					}
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	row.Seconds = elapsed.Seconds()
	w.end(&row)
	if cls != nil {
		counts := make([]EtcdCounts, len(p.Clusters)) // one snapshot for the row and its clusters
		for i, cl := range p.Clusters {
			counts[i] = cl.Counter.Snapshot().Sub(clStart[i].client)
		}
		c := sumCounts(counts)
		row.Etcd = &c
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.SetupTimeout)
		skus, err := cls.skuCounts(Uncounted(cctx))
		if err == nil {
			row.Clusters, err = endClusters(cctx, p.Clusters, p.Prefix, clStart, counts, skus)
		}
		ccancel()
		if err != nil {
			row.Problems = append(row.Problems, "per-cluster figures: "+err.Error())
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	row.Goroutines, row.HeapMiB = runtime.NumGoroutine(), float64(ms.HeapInuse)/(1<<20)

	var served, refusals []time.Duration
	first := time.Time{}
	sold := map[int]int64{}
	var samples []truthSample
	for i := range buyers {
		sb := &buyers[i]
		row.Orders += sb.served
		row.LateOrders += sb.lateServed
		if sh.Lines > 1 {
			row.Lines += sb.lines
		}
		row.Refusals += sb.refusals
		row.Releases += sb.releases
		row.Errors += sb.errors
		row.Unresolved += sb.unresolved
		if sb.firstErr != nil && row.FirstError == "" {
			row.FirstError = sb.firstErr.Error()
		}
		if sb.refusals > 0 && (first.IsZero() || sb.firstRefusal.Before(first)) {
			first = sb.firstRefusal
		}
		served = append(served, sb.servedLat...)
		refusals = append(refusals, sb.refusalLat...)
		for k, v := range sb.sold {
			sold[k] += v
		}
		samples = append(samples, sb.samples...)
	}
	slices.Sort(served)
	slices.Sort(refusals)
	row.ServedMs, row.RefusalMs = latencyOf(served), latencyOf(refusals)
	row.OrdersPerSec = float64(row.Orders) / elapsed.Seconds()
	if late := elapsed - cfg.Duration/2; late > 0 {
		row.LateOrdersPerSec = float64(row.LateOrders) / late.Seconds()
	}
	row.Costs = orderCosts(row.Orders, row.Etcd, row.EtcdServer)
	row.Costs.addCPU(row.CPUSeconds, row.Orders)
	if k := row.Costs.KeysPerOrder; k != nil && sh.Lines > 1 && row.Lines > 0 {
		v := *k / float64(sh.Lines) // every order a cart of sh.Lines
		if sh.CartShare > 0 && sh.CartShare < 1 {
			v = *k * float64(row.Orders) / float64(row.Lines)
		}
		row.Costs.KeysPerLine = &v
	}
	if row.Refusals > 0 {
		row.RefusalsPerSec = float64(row.Refusals) / time.Since(first).Seconds()
	}
	vctx, vcancel := context.WithTimeout(Uncounted(context.WithoutCancel(ctx)), cfg.SetupTimeout)
	defer vcancel()
	for _, smp := range samples {
		row.TruthChecked++
		have, err := remainingAt(vctx, smp.sku, smp.rev)
		if err != nil {
			row.Problems = append(row.Problems, fmt.Sprintf("check a refusal of %s at revision %d: %v", SKUName(smp.sku), smp.rev, err))
			continue
		}
		if smp.rev < smp.start || have >= 1 || have != smp.remains {
			row.Untrue++
			if row.Untrue <= 3 {
				row.Problems = append(row.Problems, fmt.Sprintf("refusal of %s not true: judged at revision %d (order started at %d), said %d left, the books held %d",
					SKUName(smp.sku), smp.rev, smp.start, smp.remains, have))
			}
		}
	}
	books, err := s.Verify(vctx)
	if err != nil {
		return fail("verify: %v", err)
	}
	row.Problems = append(row.Problems, books.Problems...)
	for k, v := range sold {
		if k < len(books.Sold) && books.Sold[k] < v {
			row.Problems = append(row.Problems, fmt.Sprintf("%s: the buyers hold %d units, the books record %d", SKUName(k), v, books.Sold[k]))
		}
	}
	for k := range books.Sold {
		if books.Sold[k] > books.Stock[k] {
			row.Oversold += books.Sold[k] - books.Stock[k]
		}
	}
	if row.Oversold > 0 {
		row.Problems = append(row.Problems, fmt.Sprintf("oversold %d units", row.Oversold))
	}
	if row.Unresolved > 0 {
		row.Problems = append(row.Problems, fmt.Sprintf("%d orders unresolved (first error: %s)", row.Unresolved, row.FirstError))
	}
	row.OK = len(row.Problems) == 0
	return row
}

// saleAttempts tries f up to 3 times (the same order ID each time), each
// attempt bounded by the attempt timeout; ok false when every attempt
// failed.
func saleAttempts(ctx context.Context, cfg *SaleConfig, sb *saleBuyer, f func(context.Context) (OrderOutcome, error)) (OrderOutcome, bool) {
	for attempt := 0; attempt < 3; attempt++ {
		actx, cancel := context.WithTimeout(ctx, cfg.AttemptTimeout)
		out, err := f(actx)
		cancel()
		if err == nil {
			return out, true
		}
		sb.errors++
		if sb.firstErr == nil {
			sb.firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return OrderOutcome{}, false
}

// window counts etcd's requests over a row's selling window.
type window struct {
	cfg      *SaleConfig
	counted  bool
	cpu      time.Duration // this process's CPU time at the start
	client   EtcdCounts
	server   EtcdServerCounts
	serverOK bool
	err      error
	// answeredBefore and sentAfter are the clients' writes answered just
	// before, and sent just after, the server's snapshot at the start
	// (EtcdCounter.writeEdges; SaleRow.writeBounds).
	answeredBefore, sentAfter int64
}

// startWindow snapshots the counters at a window's start; counted is
// false for a row that does not sell on etcd (nothing is reported).
func startWindow(cfg *SaleConfig, counted bool) *window {
	w := &window{cfg: cfg, counted: counted}
	if !counted {
		return w
	}
	w.client = cfg.Counter.Snapshot()
	if cfg.Server != nil {
		_, w.answeredBefore = cfg.Counter.writeEdges()
		w.server, w.err = cfg.Server.Snapshot()
		w.sentAfter, _ = cfg.Counter.writeEdges()
		w.serverOK = w.err == nil
		w.cpu = selfCPU()
	}
	return w
}

// end puts the counts from the window's start into row; a server count
// that failed is a problem of the row.
func (w *window) end(row *SaleRow) {
	if !w.counted {
		return
	}
	if w.cfg.Counter != nil {
		c := w.cfg.Counter.Snapshot().Sub(w.client)
		row.Etcd = &c
	}
	if w.serverOK {
		if cpu := selfCPU(); w.cpu > 0 && cpu > w.cpu {
			row.CPUSeconds = (cpu - w.cpu).Seconds()
		}
		_, answeredBefore := w.cfg.Counter.writeEdges()
		now, err := w.cfg.Server.Snapshot()
		sentAfter, _ := w.cfg.Counter.writeEdges()
		if err == nil {
			c := now.Sub(w.server)
			row.EtcdServer = &c
			// Every write etcd applied between its snapshots was sent
			// before the second ended and not answered before the first
			// began; every write sent after the first ended and
			// answered before the second began was applied between them.
			row.writeBounds = [2]int64{answeredBefore - w.sentAfter, sentAfter - w.answeredBefore}
		}
		w.err = err
	}
	if w.err != nil {
		row.Problems = append(row.Problems, "read etcd's counters: "+w.err.Error())
	}
}

// sumCounts is the sum of counts.
func sumCounts(counts []EtcdCounts) EtcdCounts {
	var sum EtcdCounts
	for _, c := range counts {
		sum = EtcdCounts{Reads: sum.Reads + c.Reads, Writes: sum.Writes + c.Writes, Puts: sum.Puts + c.Puts,
			Compares: sum.Compares + c.Compares, Refused: sum.Refused + c.Refused,
			Groups: sum.Groups + c.Groups, RefusedGroups: sum.RefusedGroups + c.RefusedGroups}
	}
	return sum
}

package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/cmd/stockctl/sale"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/embedetcd"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/segments"
)

// Defaults of the demo: a 10,000-unit flash sale. With 20 segments and a
// 20 ms business step the ideal is 1,000 orders/s; about 5,000 orders of 1
// to 3 units sell it out in seconds.
const (
	demoTotal        = 10000
	demoSegments     = 20
	demoInitialFill  = 1000
	demoLowWatermark = 20
	demoRefillBatch  = 50
	demoCoordinators = 4
	demoBuyers       = 200
	demoStep         = 20 * time.Millisecond
	demoMaxDuration  = 2 * time.Minute
	// demoAttemptTimeout bounds one attempt at an order: far above the
	// p99 (about 0.5 s here), so it only cuts off attempts that hang.
	demoAttemptTimeout = 5 * time.Second
	demoSKU            = "flash-sale"
	// demoLeaderWait bounds the wait for a rebalancer to be elected (the
	// demo's own, or one already running, e.g. `stockctl serve`'s) before
	// the sale starts; the sale starts anyway: segments hold stock.
	demoLeaderWait = 10 * time.Second
	// Checkout mode: reservations wait 1 s for their payment (short, so
	// that the demo sees them expire and sells their stock again within
	// its run), 30% are never paid, and a buyer may hold 4 units.
	demoReserveTTL   = time.Second
	demoAbandon      = 30
	demoPerUserLimit = 4
)

func demoCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "demo",
		Usage: "run a flash sale on an embedded etcd and show what happened",
		Description: "Creates a SKU with most of its stock in the central pool, runs the rebalancer and a crowd of\n" +
			"concurrent buyers on several coordinators (each on its own etcd client, like separate processes),\n" +
			"each order holding its segment's lock through a simulated business step, until the SKU is sold\n" +
			"out. Then it checks that nothing was oversold (units sold = total, and the audit agrees) and\n" +
			"prints the figures and the per-segment table. Exit 1 if any check fails.\n" +
			"Without --endpoints it runs on an embedded etcd in a temporary directory, removed at the end.",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "sku", Usage: "SKU to create (default: flash-sale; with --endpoints flash-sale-<time>)"},
			&ucli.Int64Flag{Name: "total", Value: demoTotal, Usage: "units on sale"},
			&ucli.IntFlag{Name: "segments", Value: demoSegments, Usage: "segments"},
			&ucli.Int64Flag{Name: "initial-fill", Value: demoInitialFill, Usage: "units that start in the segments; the rest starts in the pool"},
			&ucli.Int64Flag{Name: "low-watermark", Value: demoLowWatermark, Usage: "the rebalancer refills a segment holding less"},
			&ucli.Int64Flag{Name: "refill-batch", Value: demoRefillBatch, Usage: "units per refill"},
			&ucli.IntFlag{Name: "coordinators", Value: demoCoordinators, Usage: "coordinators (etcd clients) the buyers share"},
			&ucli.IntFlag{Name: "buyers", Value: demoBuyers, Usage: "concurrent buyers"},
			&ucli.DurationFlag{Name: "step", Value: demoStep, Usage: "business step each order runs while holding its segment's lock"},
			&ucli.Int64Flag{Name: "min-qty", Value: 1, Usage: "smallest order"},
			&ucli.Int64Flag{Name: "max-qty", Value: 3, Usage: "largest order"},
			&ucli.DurationFlag{Name: "max-duration", Value: demoMaxDuration, Usage: "stop the sale after this long even if not sold out"},
			&ucli.DurationFlag{Name: "attempt-timeout", Value: demoAttemptTimeout,
				Usage: "give up an attempt at an order after this long and retry it under the same order ID"},
			&ucli.Uint64Flag{Name: "seed", Usage: "seed of the order quantities (0: random)"},
			&ucli.StringFlag{Name: "progress", Value: "auto", EnvVars: []string{"STOCKCTL_PROGRESS"},
				Usage: "live progress line on stderr: auto (when stderr is a terminal), always or never"},
			&ucli.BoolFlag{Name: "checkout", Usage: "sell as a shop does: every order is a reservation, paid (confirmed) after the step, " +
				"some never paid and left to expire; buyers have a per-user limit"},
			&ucli.DurationFlag{Name: "reserve-ttl", Value: demoReserveTTL, Usage: "with --checkout: how long a reservation waits for its payment"},
			&ucli.IntFlag{Name: "abandon", Value: demoAbandon, Usage: "with --checkout: percent of reservations never paid"},
			&ucli.Int64Flag{Name: "per-user-limit", Usage: "most units one buyer may hold (0: none; with --checkout the default is 4)"},
		},
		Action: demoAction,
	}
}

// demoConfig is the demo's validated flags.
type demoConfig struct {
	SKU          string  `json:"sku"`
	Total        int64   `json:"total"`
	Segments     int     `json:"segments"`
	InitialFill  int64   `json:"initialFill"`
	LowWatermark int64   `json:"lowWatermark"`
	RefillBatch  int64   `json:"refillBatch"`
	Coordinators int     `json:"coordinators"`
	Buyers       int     `json:"buyers"`
	StepMs       float64 `json:"stepMs"`
	MinQty       int64   `json:"minQty"`
	MaxQty       int64   `json:"maxQty"`
	Seed         uint64  `json:"seed,omitempty"`
	// Checkout mode (--checkout): reservations, abandoned carts, a per-user
	// limit. Omitted from the JSON when off.
	Checkout       bool    `json:"checkout,omitempty"`
	ReserveTTLMs   float64 `json:"reserveTtlMs,omitempty"`
	AbandonPercent int     `json:"abandonPercent,omitempty"`
	PerUserLimit   int64   `json:"perUserLimit,omitempty"`

	step           time.Duration
	reserveTTL     time.Duration
	maxDuration    time.Duration
	attemptTimeout time.Duration
	progress       string
}

func readDemoConfig(c *ucli.Context, g *globals) (demoConfig, error) {
	d := demoConfig{
		SKU: c.String("sku"), Total: c.Int64("total"), Segments: c.Int("segments"),
		InitialFill: c.Int64("initial-fill"), LowWatermark: c.Int64("low-watermark"), RefillBatch: c.Int64("refill-batch"),
		Coordinators: c.Int("coordinators"), Buyers: c.Int("buyers"), step: c.Duration("step"),
		MinQty: c.Int64("min-qty"), MaxQty: c.Int64("max-qty"), maxDuration: c.Duration("max-duration"),
		Seed: c.Uint64("seed"), progress: c.String("progress"), attemptTimeout: c.Duration("attempt-timeout"),
		Checkout: c.Bool("checkout"), reserveTTL: c.Duration("reserve-ttl"), AbandonPercent: c.Int("abandon"),
		PerUserLimit: c.Int64("per-user-limit"),
	}
	d.StepMs = ms(d.step)
	if d.Checkout {
		d.ReserveTTLMs = ms(d.reserveTTL)
		if !c.IsSet("per-user-limit") {
			d.PerUserLimit = demoPerUserLimit
		}
		if err := segments.ValidateTTL(d.reserveTTL); err != nil {
			return d, usageError("--reserve-ttl: %v", err)
		}
		if d.AbandonPercent < 0 || d.AbandonPercent > 90 {
			return d, usageError("invalid --abandon %d: must be between 0 and 90 (percent of reservations never paid)", d.AbandonPercent)
		}
		if d.PerUserLimit > 0 && d.PerUserLimit < d.MaxQty {
			return d, usageError("invalid --per-user-limit %d: below --max-qty %d, no buyer could place the largest order", d.PerUserLimit, d.MaxQty)
		}
		if !c.IsSet("attempt-timeout") {
			// An order may wait for expiring reservations to give stock
			// back before it is told the sale is over.
			d.attemptTimeout = max(d.attemptTimeout, d.reserveTTL+demoAttemptTimeout)
		}
	} else {
		d.AbandonPercent = 0
	}
	if c.NArg() > 0 {
		return d, usageError("demo takes no arguments, got %q (use --sku to name the SKU)", c.Args().Slice())
	}
	if d.SKU == "" {
		d.SKU = demoSKU
		if len(g.endpoints) > 0 {
			d.SKU = fmt.Sprintf("%s-%s", demoSKU, time.Now().UTC().Format("20060102-150405"))
		}
	}
	if err := segments.ValidateSKU(d.SKU); err != nil {
		return d, usageError("--sku: %v", err)
	}
	if !c.IsSet("initial-fill") && d.InitialFill > d.Total {
		d.InitialFill = d.Total // a small --total keeps the default sensible
	}
	if err := validateSKUConfig(coordinator.SKUConfig{Total: d.Total, Segments: d.Segments, InitialFill: d.InitialFill,
		LowWatermark: d.LowWatermark, RefillBatch: d.RefillBatch, PerUserLimit: d.PerUserLimit}); err != nil {
		return d, err
	}
	switch {
	case d.Total < 1:
		return d, usageError("invalid --total %d: a sale needs at least 1 unit", d.Total)
	case d.Coordinators < 1 || d.Coordinators > 64:
		return d, usageError("invalid --coordinators %d: must be between 1 and 64", d.Coordinators)
	case d.Buyers < 1 || d.Buyers > 100000:
		return d, usageError("invalid --buyers %d: must be between 1 and 100000", d.Buyers)
	case d.step < 0:
		return d, usageError("invalid --step %v: must not be negative", d.step)
	case d.MinQty < 1 || d.MaxQty < d.MinQty || d.MaxQty > segments.MaxQty:
		return d, usageError("invalid --min-qty %d / --max-qty %d: want 1 ≤ min ≤ max ≤ %d", d.MinQty, d.MaxQty, segments.MaxQty)
	case d.maxDuration <= 0:
		return d, usageError("invalid --max-duration %v: must be positive", d.maxDuration)
	case d.attemptTimeout <= 0:
		return d, usageError("invalid --attempt-timeout %v: must be positive", d.attemptTimeout)
	case d.progress != "auto" && d.progress != "always" && d.progress != "never":
		return d, usageError("invalid --progress %q: want auto, always or never", d.progress)
	}
	return d, nil
}

func demoAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	d, err := readDemoConfig(c, g)
	if err != nil {
		return err
	}
	ctx, stop := signalContext(c)
	defer stop()

	// Setup: etcd, clients, coordinators, the SKU; bounded by --timeout.
	sctx, cancelSetup := g.boundedContext(ctx)
	defer cancelSetup()
	eg := *g
	if len(g.endpoints) == 0 {
		dir, err := os.MkdirTemp("", "stockctl-demo-")
		if err != nil {
			return failed(ctx, "create a temporary directory for the demo's etcd", err)
		}
		defer os.RemoveAll(dir)
		srv, err := startEmbedded(sctx, embedetcd.Config{Dir: dir})
		if err != nil {
			return err
		}
		defer srv.Close()
		eg.endpoints = srv.Endpoints()
	}
	// One connection per coordinator, as if each were its own process,
	// plus one for the rebalancer.
	conns := make([]*conn, d.Coordinators+1)
	defer func() {
		for _, cn := range conns {
			if cn != nil {
				cn.Close()
			}
		}
	}()
	for i := range conns {
		// Each coordinator has an identity of its own, as a process would,
		// so that a status --watch of the sale tells the lock holders apart.
		if conns[i], err = connect(sctx, c, &eg, coordinator.WithIdentity(fmt.Sprintf("%s#%d", eg.identity, i+1))); err != nil {
			return err
		}
	}
	if _, err := conns[0].coord.CreateSKU(sctx, d.SKU, coordinator.SKUConfig{Total: d.Total, Segments: d.Segments,
		InitialFill: d.InitialFill, LowWatermark: d.LowWatermark, RefillBatch: d.RefillBatch, PerUserLimit: d.PerUserLimit}); err != nil {
		return opFailed(sctx, err)
	}
	created, err := conns[0].coord.Status(sctx, d.SKU)
	if err != nil {
		return opFailed(sctx, err)
	}
	cancelSetup()

	t := newDemoTally(d.Segments)
	stopRebalancer, leader, err := startDemoRebalancer(ctx, conns[d.Coordinators], t)
	if err != nil {
		return failed(ctx, "start the rebalancer", err)
	}
	defer stopRebalancer()

	if g.output == outputTable {
		fmt.Fprintf(c.App.Writer, "flash sale of %s: %d units in %d segments (%d in the segments, %d in the pool), "+
			"%d buyers on %d coordinators, %v business step; rebalancer: %s\n\n",
			d.SKU, d.Total, d.Segments, d.InitialFill, d.Total-d.InitialFill, d.Buyers, d.Coordinators, d.step, leaderText(leader))
	}
	coords := make([]*coordinator.Coordinator, d.Coordinators)
	for i := range coords {
		coords[i] = conns[i].coord
	}
	pl := newProgressLine(c.App.ErrWriter, d.progress, d.Total)
	buy := demoBuy(coords, d.SKU, d.step, t)
	if d.Checkout {
		buy = demoCheckoutBuy(coords, d, t)
		if g.output == outputTable {
			fmt.Fprintf(c.App.Writer, "checkout: every order a reservation of %v, %d%% never paid, at most %d units per buyer\n\n",
				d.reserveTTL, d.AbandonPercent, d.PerUserLimit)
		}
	}
	res, saleErr := sale.Run(ctx, sale.Config{
		Buyers:         d.Buyers,
		Buy:            buy,
		MinQty:         d.MinQty,
		MaxQty:         d.MaxQty,
		MaxDuration:    d.maxDuration,
		AttemptTimeout: d.attemptTimeout,
		// Enough for every buyer to see an attempt or two time out (a
		// stuck lock cuts off everyone queued behind it at once), while
		// still ending a sale against an etcd that fails every call.
		MaxErrors: 2 * int64(d.Buyers),
		Seed:      d.Seed,
		Progress:  pl.update,
	})
	if res == nil {
		return failed(ctx, "run the sale", saleErr)
	}
	stopRebalancer()

	// The books, read after the sale even if it was interrupted.
	rctx, cancel := g.boundedContext(context.WithoutCancel(ctx))
	defer cancel()
	st, err := conns[0].coord.Status(rctx, d.SKU)
	if err != nil {
		return opFailed(rctx, err)
	}
	audit, err := conns[0].coord.Audit(rctx, d.SKU)
	if err != nil {
		return opFailed(rctx, err)
	}
	moves, err := readMoves(rctx, conns[0].coord, d.SKU, d.Segments, created.Revision, st.Revision)
	if err != nil {
		return failed(rctx, "read the moves of "+d.SKU+" from etcd's history", err)
	}
	report := newDemoReport(d, res, st, audit, t, moves, leader)
	if d.Checkout {
		held, err := buyerUnits(rctx, conns[0].coord, d.SKU)
		if err != nil {
			return failed(rctx, "read the buyers' counters of "+d.SKU, err)
		}
		books, err := readCheckout(rctx, conns[0].coord, d.SKU)
		if err != nil {
			return failed(rctx, "read the order records of "+d.SKU, err)
		}
		report.addCheckout(d, t, books, held)
	}
	if err := show(c, g, report); err != nil {
		return err
	}
	if saleErr != nil {
		return failed(ctx, "finish the sale", saleErr)
	}
	if len(report.Failures) > 0 {
		return ucli.Exit(fmt.Errorf("demo failed: %s", strings.Join(report.Failures, "; ")), ExitFailure)
	}
	return nil
}

// demoBuy places an order on coordinator buyer%len(cs), holding the
// segment's lock through a business step of the given length.
func demoBuy(cs []*coordinator.Coordinator, sku string, step time.Duration, t *demoTally) sale.Buy {
	businessStep := func(ctx context.Context) error {
		if step > 0 && !background.Sleep(ctx, step) {
			return context.Cause(ctx)
		}
		return nil
	}
	return func(ctx context.Context, buyer int, order string, qty int64, routeKey string) (*coordinator.Allocation, error) {
		a, err := cs[buyer%len(cs)].AllocateFunc(ctx, sku, order, qty, routeKey, businessStep)
		if err == nil {
			t.order(a)
		}
		return a, err
	}
}

// startDemoRebalancer runs a rebalancer until the returned stop is called
// (idempotent), after waiting a bounded time for a rebalancer to be
// elected: this one, or one that already leads (`stockctl serve`'s, when
// the demo runs against its etcd), which is the one that will move stock.
// It returns the leader's identity ("" if none was elected in time).
func startDemoRebalancer(ctx context.Context, cn *conn, t *demoTally) (stop func(), leader string, err error) {
	r, err := rebalance.New(cn.coord, rebalance.Config{Identity: "demo-rebalancer", OnExpire: t.expire})
	if err != nil {
		return nil, "", err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(rctx) })
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
	}
	deadline := time.Now().Add(demoLeaderWait)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if r.Leader() {
			return stop, r.Identity(), nil
		}
		if leader = currentLeader(cn, cn.coord); leader != "" {
			return stop, leader, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ctx.Err() != nil {
		stop()
		return nil, "", context.Cause(ctx)
	}
	return stop, "", nil
}

// leaderText names the elected rebalancer for the demo's first line.
func leaderText(leader string) string {
	switch leader {
	case "":
		return "none elected yet"
	case "demo-rebalancer":
		return "the demo's own"
	}
	return leader + " (another process's: it makes the moves)"
}

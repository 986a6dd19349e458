package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ucli "github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/segments"
)

func rebalanceCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "rebalance",
		Usage: "make one elected rebalancer pass over a SKU now, or run the rebalancer (--watch)",
		Description: "Without --watch, campaigns for the rebalancer's leadership (waiting up to --timeout while\n" +
			"another rebalancer leads), makes one pass over SKU, records it and resigns.\n" +
			"With --watch, runs the rebalancer for every SKU under the prefix until interrupted, printing\n" +
			"each move (only SKU's, if one is given).",
		ArgsUsage: "SKU | --watch [SKU]",
		Flags: []ucli.Flag{
			&ucli.BoolFlag{Name: "watch", Usage: "run the rebalancer until interrupted"},
			identityFlag(),
			metricsAddrFlag(),
		},
		Action: rebalanceAction,
	}
}

// moveView is one committed move of the rebalancer.
type moveView struct {
	SKU     string `json:"sku"`
	Segment int    `json:"segment"`
	Kind    string `json:"kind"` // "refill" (pool → segment) or "drain" (segment → pool)
	Qty     int64  `json:"qty"`
	// Revision is the etcd revision that committed the move.
	Revision int64 `json:"revision"`
	// TriggerRevision (refills) is the revision that took the segment below
	// its watermark, 0 when a sweep found it.
	TriggerRevision int64 `json:"triggerRevision"`
	// LatencyMs (refills) is from seeing the crossing to the commit.
	LatencyMs float64 `json:"latencyMs"`
	Leader    string  `json:"leader"`
}

func moveViewOf(m rebalance.Move) moveView {
	return moveView{SKU: m.SKU, Segment: m.Segment, Kind: m.Kind.String(), Qty: m.Qty, Revision: m.Revision,
		TriggerRevision: m.TriggerRevision, LatencyMs: ms(m.Latency), Leader: m.Leader}
}

func (m moveView) row() []string {
	return []string{fmt.Sprint(m.Segment), m.Kind, fmt.Sprint(m.Qty), fmt.Sprint(m.Revision)}
}

var moveHeader = []string{"SEGMENT", "KIND", "QTY", "REVISION"}

// passView is the result of rebalance SKU.
type passView struct {
	SKU      string     `json:"sku"`
	Leader   string     `json:"leader"`
	Revision int64      `json:"revision"`
	Moves    []moveView `json:"moves"`
	// Expired are the reservations the pass found past their deadline and
	// expired (their units went back).
	Expired []expiryView `json:"expired"`
}

// expiryView is one reservation a rebalancer pass expired.
type expiryView struct {
	Order    string    `json:"order"`
	Qty      int64     `json:"qty"`
	Buyer    string    `json:"buyer,omitempty"`
	Deadline time.Time `json:"deadline"`
	Revision int64     `json:"revision"`
}

func (v passView) table() table {
	var t table
	t.add("SKU", v.SKU)
	t.add("LEADER", v.Leader)
	if len(v.Expired) > 0 {
		var units int64
		for _, x := range v.Expired {
			units += x.Qty
		}
		t.add("EXPIRED", fmt.Sprintf("%d reservations (%d units returned)", len(v.Expired), units))
	}
	t.add("MOVES", len(v.Moves))
	if len(v.Moves) == 0 {
		t.notes = append(t.notes, "(nothing to move: every segment is at or above its low watermark, or the pool is empty)")
		return t
	}
	t.add("REVISION", v.Revision)
	t.header = moveHeader
	for _, m := range v.Moves {
		t.rows = append(t.rows, m.row())
	}
	return t
}

func rebalanceAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	if c.Bool("watch") {
		sku := ""
		if c.NArg() > 0 {
			if sku, err = oneArg(c, "SKU", segments.ValidateSKU); err != nil {
				return err
			}
		}
		return watchRebalancer(c, g, sku)
	}
	if c.IsSet("metrics-addr") {
		return usageError("--metrics-addr serves metrics while the rebalancer runs: use it with --watch (a single pass has nothing to scrape)")
	}
	sku, err := oneArg(c, "SKU", segments.ValidateSKU)
	if err != nil {
		return err
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		where, err := cn.coord.ClusterOf(ctx, sku)
		if err != nil {
			return failed(ctx, "rebalance "+sku, err)
		}
		in := clusterCoord(cn.coord, where) // the rebalancer of the SKU's cluster
		if _, _, err := engines.Of(in).Stock.Meta(ctx, sku); err != nil {
			return failed(ctx, "rebalance "+sku, err)
		}
		r, err := rebalance.New(in, rebalance.Config{Identity: g.identity})
		if err != nil {
			return failed(ctx, "set up the rebalancer", err)
		}
		pass, err := r.RunOnce(ctx, sku)
		if err != nil {
			// RunOnce's error names the pass: "rebalance SKU: ...".
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(context.Cause(ctx), context.DeadlineExceeded) || ctx.Err() != nil {
				if leader := currentLeader(cn, in); leader != "" {
					err = fmt.Errorf("%w; another rebalancer leads (%s): its passes keep %s stocked", err, leader, sku)
				}
			}
			return opFailed(ctx, err)
		}
		v := passView{SKU: sku, Leader: pass.Leader, Revision: pass.Revision, Moves: []moveView{}, Expired: []expiryView{}}
		for _, m := range pass.Moves {
			v.Moves = append(v.Moves, moveViewOf(m))
		}
		for _, x := range pass.Expired {
			v.Expired = append(v.Expired, expiryView{Order: x.Order, Qty: x.Qty, Buyer: x.Buyer, Deadline: x.Deadline.UTC(), Revision: x.Revision})
		}
		return show(c, g, v)
	})
}

// currentLeader names the elected rebalancer, or "" if there is none or
// it cannot be read.
// With several clusters, in is the one-cluster coordinator of the cluster
// whose rebalancer is wanted.
func currentLeader(cn *conn, in *coordinator.Coordinator) string {
	ctx, cancel := context.WithTimeout(context.Background(), cn.g.dialTimeout)
	defer cancel()
	resp, err := engines.Of(in).KV.Get(ctx, engines.Of(in).Keys.Election()+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// watchRebalancer runs the rebalancer until interrupted, printing moves.
func watchRebalancer(c *ucli.Context, g *globals, sku string) error {
	ctx, stop := signalContext(c)
	defer stop()
	metrics, err := startMetrics(c, c.App.ErrWriter)
	if err != nil {
		return err
	}
	defer metrics.close()
	var opts []coordinator.Option
	if reg := metrics.registerer(); reg != nil {
		opts = append(opts, coordinator.WithMetrics(reg))
	}
	sctx, cancel := g.boundedContext(ctx)
	cn, err := connect(sctx, c, g, opts...)
	cancel()
	if err != nil {
		return err
	}
	defer cn.Close()
	if reg := metrics.registerer(); reg != nil {
		registerEtcdCollectors(reg, cn)
	}
	printer := newMovePrinter(c.App.Writer, g.output)
	if sku != "" {
		printer.only = sku
	}
	return runRebalancer(ctx, c, cn, printer, metrics.registerer())
}

// runRebalancer runs a rebalancer on cn until ctx ends; an interrupt is a
// normal end.
// Its metrics go to reg, if not nil.
//
// With several clusters it runs one rebalancer per cluster, each elected in
// its own cluster, their metrics labelled with the cluster.
func runRebalancer(ctx context.Context, c *ucli.Context, cn *conn, printer *movePrinter, reg prometheus.Registerer) error {
	names := cn.coord.Clusters()
	if names == nil {
		return runRebalancerIn(ctx, c, cn, cn.coord, "", printer, reg)
	}
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		creg := reg
		if reg != nil {
			creg = prometheus.WrapRegistererWith(prometheus.Labels{"cluster": name}, reg)
		}
		wg.Go(func() { errs[i] = runRebalancerIn(ctx, c, cn, cn.coord.Cluster(name), name, printer, creg) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// runRebalancerIn runs the rebalancer of one cluster (name "": the only
// one) until ctx ends.
func runRebalancerIn(ctx context.Context, c *ucli.Context, cn *conn, in *coordinator.Coordinator, name string, printer *movePrinter, reg prometheus.Registerer) error {
	r, err := rebalance.New(in, rebalance.Config{
		Identity: cn.g.identity,
		Logger:   cn.g.logger(c.App.ErrWriter),
		OnMove:   printer.print,
	})
	if err != nil {
		return failed(ctx, "set up the rebalancer", err)
	}
	if reg != nil {
		if err := reg.Register(r.Collector()); err != nil {
			return failed(ctx, "register the rebalancer's metrics", err)
		}
	}
	where := ""
	if name != "" {
		where = " in cluster " + name
	}
	fmt.Fprintf(c.App.ErrWriter, "rebalancer %s campaigning under %s%s; interrupt (^C) to stop\n", r.Identity(), cn.g.prefix, where)
	if err := r.Run(ctx); err != nil {
		return failed(ctx, "run the rebalancer", err)
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, errInterrupted) && !errors.Is(cause, context.Canceled) {
		return failed(ctx, "run the rebalancer", cause)
	}
	return nil
}

// movePrinter prints moves as they happen: a line each in table form, a
// JSON object per line with -o json.
type movePrinter struct {
	mu     sync.Mutex
	w      io.Writer
	output string
	only   string // print only this SKU's moves, if set
}

func newMovePrinter(w io.Writer, output string) *movePrinter {
	return &movePrinter{w: w, output: output}
}

func (p *movePrinter) print(m rebalance.Move) {
	if p.only != "" && m.SKU != p.only {
		return
	}
	v := moveViewOf(m)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.output == outputJSON {
		b, _ := json.Marshal(v)
		fmt.Fprintf(p.w, "%s\n", b)
		return
	}
	dir := "pool → seg/" + fmt.Sprint(v.Segment)
	if m.Kind == rebalance.Drain {
		dir = "seg/" + fmt.Sprint(v.Segment) + " → pool"
	}
	fmt.Fprintf(p.w, "%s  %-6s  %s  %s  %d units  revision %d\n",
		time.Now().Format("15:04:05.000"), v.Kind, v.SKU, dir, v.Qty, v.Revision)
}

// ms is d in milliseconds, for JSON.
func ms(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}

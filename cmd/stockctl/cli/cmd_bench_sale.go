package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ucli "github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/stockctl/stockctl/cmd/stockctl/bench"
	"github.com/stockctl/stockctl/internal/embedetcd"
)

// saleFlags are bench's flags for the sale shapes (--sale).
func saleFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.BoolFlag{Name: "sale", EnvVars: []string{"STOCKCTL_BENCH_SALE"},
			Usage: "run the sale shapes instead of the lock shapes: sell-out storms, releases racing them, many SKUs (pure allocation); strategies stockctl (lazy segments, the default), stockctl-eager (coordinator.WithEagerSegments) and, with --redis, the Redis peers"},
		&ucli.StringFlag{Name: "sale-shapes", EnvVars: []string{"STOCKCTL_BENCH_SALE_SHAPES"},
			Usage: "with --sale: shapes to run, comma-separated (default: storm, zero, storm-release, one, many, many-skewed, many-10k, many-prepared, many-10k-prepared, cart, cart-mix, limit-64; also limit-1, limit-4, limit-18, the physical limit at smaller batches)"},
		&ucli.IntFlag{Name: "sale-skus", Value: bench.DefaultSaleSKUs, EnvVars: []string{"STOCKCTL_BENCH_SALE_SKUS"},
			Usage: "with --sale: SKUs of the many, many-skewed, many-prepared and cart shapes (the many-10k shapes have 10,000)"},
		&ucli.Int64Flag{Name: "sale-stock", Value: bench.DefaultStormStock, EnvVars: []string{"STOCKCTL_BENCH_SALE_STOCK"},
			Usage: "with --sale: units of a storm's SKU (it sells out, the buyers go on ordering)"},
		&ucli.Float64Flag{Name: "release", Value: bench.DefaultSaleRelease, EnvVars: []string{"STOCKCTL_BENCH_RELEASE"},
			Usage: "with --sale: share of served orders released again in the storm-release shape"},
		&ucli.Float64Flag{Name: "skew", Value: bench.DefaultSaleSkew, EnvVars: []string{"STOCKCTL_BENCH_SKEW"},
			Usage: "with --sale: Zipf exponent of the SKUs' popularity in the many-skewed shape (a few hot, a long tail)"},
		&ucli.IntFlag{Name: "sale-segments", Value: bench.DefaultSaleSegments, EnvVars: []string{"STOCKCTL_BENCH_SALE_SEGMENTS"},
			Usage: "with --sale: segments of every SKU"},
		&ucli.IntFlag{Name: "limit-writers",
			Usage: "with --sale: concurrent writers of the physical-limit rows (limit-N; default: one per process, as many as the coordinators)"},
		&ucli.IntFlag{Name: "clusters",
			Usage: "with --sale: also run the stockctl strategy on a coordinator over this many embedded etcd clusters (each as --cluster makes the one etcd), beside the one-cluster rows, and report each cluster's share of the SKUs, etcd requests and keys written (2 to 8; default: one cluster only)"},
		&ucli.IntFlag{Name: "truth-sample", Value: bench.DefaultTruthSample,
			Usage: "with --sale: check one refusal in this many (of buyers refused before) against the books at its revision (0: none)"},
	}
}

// saleReport is bench --sale's result (its -o json shape).
type saleReport struct {
	Config  saleConfig      `json:"config"`
	Machine bench.Machine   `json:"machine"`
	Rows    []bench.SaleRow `json:"rows"`
	Targets []bench.Target  `json:"targets"`
	OK      bool            `json:"ok"`
	// Failures says which runs' checks failed.
	Failures []string `json:"failures"`
}

type saleConfig struct {
	Shapes          []bench.SaleShape `json:"shapes"`
	Buyers          int               `json:"buyers"`
	Processes       int               `json:"processes"`
	Segments        int               `json:"segments"`
	DurationSeconds float64           `json:"durationSeconds"`
	Strategies      []string          `json:"strategies"`
	Etcd            string            `json:"etcd"`
	Redis           string            `json:"redis,omitempty"`
	TruthSample     int               `json:"truthSample"`
	// LimitWriters are the physical-limit rows' writers.
	LimitWriters int `json:"limitWriters"`
	// Clusters is --clusters: the embedded etcd clusters of the rows over
	// several (0: none).
	Clusters int `json:"clusters,omitempty"`
}

func benchSaleAction(c *ucli.Context, g *globals) error {
	b, err := readBenchConfig(c, g)
	if err != nil {
		return err
	}
	if addr := os.Getenv("STOCKCTL_BENCH_PPROF"); addr != "" {
		// For finding where a run's time goes: go tool pprof http://ADDR/debug/pprof/...
		if err := checkLoopback(addr); err != nil {
			return usageError("invalid STOCKCTL_BENCH_PPROF %q: %v", addr, err)
		}
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
	shapes := bench.DefaultSaleShapes()
	if strings.TrimSpace(c.String("sale-shapes")) != "" {
		shapes = append(shapes, bench.OptionalSaleShapes()...)
	}
	for i := range shapes {
		switch {
		case shapes[i].SKUs == bench.DefaultSaleSKUs:
			shapes[i].SKUs = c.Int("sale-skus")
		case shapes[i].Stock == bench.DefaultStormStock:
			shapes[i].Stock = c.Int64("sale-stock")
		}
		if shapes[i].Release > 0 {
			shapes[i].Release = c.Float64("release")
		}
		if shapes[i].Skew > 0 {
			shapes[i].Skew = c.Float64("skew")
		}
	}
	if shapes, err = bench.SelectSaleShapes(shapes, c.String("sale-shapes")); err != nil {
		return usageError("invalid --sale-shapes: %v", err)
	}
	cfg := saleConfig{Shapes: shapes, Buyers: c.Int("buyers"), Processes: b.Processes, Segments: c.Int("sale-segments"),
		DurationSeconds: b.duration.Seconds(), Etcd: b.Etcd, Redis: b.Redis, TruthSample: c.Int("truth-sample")}
	if cfg.Buyers == 0 {
		cfg.Buyers = bench.DefaultSaleBuyers
	}
	cfg.LimitWriters = c.Int("limit-writers")
	if cfg.LimitWriters == 0 {
		cfg.LimitWriters = cfg.Processes
	}
	switch {
	case cfg.Buyers < 1 || cfg.Buyers > maxBenchBuyers:
		return usageError("invalid --buyers %d: must be between 1 and %d", cfg.Buyers, maxBenchBuyers)
	case c.Int("sale-skus") < 1 || c.Int("sale-skus") > 100_000:
		return usageError("invalid --sale-skus %d: must be between 1 and 100000", c.Int("sale-skus"))
	case c.Int64("sale-stock") < 0:
		return usageError("invalid --sale-stock %d: must not be negative", c.Int64("sale-stock"))
	case c.Float64("release") < 0 || c.Float64("release") > 1:
		return usageError("invalid --release %v: a share, from 0 to 1", c.Float64("release"))
	case c.Float64("skew") < 0:
		return usageError("invalid --skew %v: must not be negative", c.Float64("skew"))
	case cfg.Segments < 1 || cfg.Segments > 1024:
		return usageError("invalid --sale-segments %d: must be between 1 and 1024", cfg.Segments)
	case cfg.LimitWriters < 1 || cfg.LimitWriters > 1024:
		return usageError("invalid --limit-writers %d: must be between 1 and 1024", cfg.LimitWriters)
	case cfg.TruthSample < 0:
		return usageError("invalid --truth-sample %d: must not be negative", cfg.TruthSample)
	}
	if c.IsSet("clusters") {
		cfg.Clusters = c.Int("clusters")
		switch {
		case cfg.Clusters < 2 || cfg.Clusters > 8:
			return usageError("invalid --clusters %d: must be between 2 and 8", cfg.Clusters)
		case len(g.endpoints) > 0:
			return usageError("--clusters starts embedded etcd clusters: it cannot be given with --endpoints")
		}
	}
	specs := []bench.SaleSpec{bench.StockctlSale(), bench.StockctlEagerSale()}
	if cfg.Clusters > 0 {
		// The one-cluster figures and the clusters' of the same run.
		specs = []bench.SaleSpec{bench.StockctlSale(), bench.StockctlClustersSale(cfg.Clusters)}
		if len(b.names) > 0 {
			specs = append(specs, bench.StockctlEagerSale())
		}
	}
	if b.Redis != "" {
		more, err := bench.RedisSaleSpecs(b.Redis)
		if errors.Is(err, bench.ErrNoRedis) {
			return usageError("--redis: this stockctl was built without the Redis peers; build the benchredis module's binary")
		}
		if err != nil {
			return usageError("--redis: %v", err)
		}
		specs = append(specs, more...)
	}
	if specs, err = bench.SelectSale(specs, b.names); err != nil {
		return usageError("invalid --strategies: %v", err)
	}
	for _, s := range specs {
		cfg.Strategies = append(cfg.Strategies, s.Name)
	}
	ctx, stop := signalContext(c)
	defer stop()
	sctx, cancelSetup := g.boundedContext(ctx)
	defer cancelSetup()
	counter := &bench.EtcdCounter{}
	// etcd's own counters, when its etcd runs in this process.
	var server *bench.EtcdServerMetrics
	if len(g.endpoints) == 0 {
		server = &bench.EtcdServerMetrics{Gatherer: prometheus.DefaultGatherer, Members: b.cluster}
	}
	clients, closeEtcd, err := benchEtcd(sctx, g, b.noFsync, b.cluster, b.Processes, grpc.WithChainUnaryInterceptor(counter.Interceptor()))
	if err != nil {
		return err
	}
	defer closeEtcd()
	var clusters []bench.SaleCluster
	if cfg.Clusters > 0 {
		clusters = append(clusters, bench.SaleCluster{Name: "c0", Etcd: clients, Counter: counter})
		for i := 1; i < cfg.Clusters; i++ {
			cc := &bench.EtcdCounter{}
			cls, closeCluster, err := benchEtcd(sctx, g, b.noFsync, b.cluster, b.Processes, grpc.WithChainUnaryInterceptor(cc.Interceptor()))
			if err != nil {
				return err
			}
			defer closeCluster()
			clusters = append(clusters, bench.SaleCluster{Name: fmt.Sprintf("c%d", i), Etcd: cls, Counter: cc})
		}
	}
	cancelSetup()

	prefix := strings.TrimSuffix(g.prefix, "/") + "/bench-" + time.Now().UTC().Format("20060102-150405") + "/"
	report := saleReport{Config: cfg, Machine: bench.ReadMachine(), Failures: []string{}}
	if g.output == outputTable {
		fmt.Fprintf(c.App.Writer, "bench --sale: %s, %d buyers over %d processes, SKUs of %d segments, %v per run, etcd %s; limit rows: %d writers\n\n",
			strings.Join(cfg.Strategies, ", "), cfg.Buyers, cfg.Processes, cfg.Segments, b.duration, cfg.Etcd, cfg.LimitWriters)
	}
	rows, runErr := bench.RunSale(ctx, bench.SaleConfig{Specs: specs, Shapes: shapes, Buyers: cfg.Buyers, Processes: cfg.Processes,
		Segments: cfg.Segments, Duration: b.duration, Etcd: clients, Prefix: prefix, AttemptTimeout: b.attemptTimeout, TruthSample: cfg.TruthSample, Counter: counter,
		Server: server, LimitWriters: cfg.LimitWriters, Clusters: clusters})
	report.Machine.LoadAvgEnd = bench.LoadAvg()
	report.Rows = rows
	if report.Rows == nil {
		report.Rows = []bench.SaleRow{}
	}
	report.Targets = bench.SaleTargets(rows)
	for _, r := range rows {
		for _, p := range r.Problems {
			report.Failures = append(report.Failures, fmt.Sprintf("%s at %s: %s", r.Strategy, r.Shape.Name, p))
		}
	}
	report.OK = len(report.Failures) == 0 && runErr == nil
	if err := show(c, g, report); err != nil {
		return err
	}
	if runErr != nil {
		return failed(ctx, "run the bench", runErr)
	}
	if !report.OK {
		return ucli.Exit(fmt.Errorf("bench failed: %s", strings.Join(report.Failures, "; ")), ExitFailure)
	}
	return nil
}

func (r saleReport) table() table {
	var t table
	m := r.Machine
	t.add("MACHINE", fmt.Sprintf("%d CPUs (%s), %s, %s", m.CPUs, m.CPUModel, m.GoVersion, m.OS))
	t.add("LOAD AVERAGE", fmt.Sprintf("%s before, %s after", m.LoadAvgStart, m.LoadAvgEnd))
	t.add("ETCD", r.Config.Etcd)
	t.header = []string{"SHAPE", "STRATEGY", "SKUS", "STOCK", "ORDERS/S", "LATE ORDERS/S", "REFUSALS/S", "SERVED P99", "REFUSAL P50", "REFUSAL P99",
		"RELEASES", "ERRORS", "TRUTH", "ETCD W/ORDER", "ETCD R/ORDER",
		"KEYS/ORDER", "KEYS/LINE", "DELS/ORDER", "CMPS/ORDER", "TXNS/ORDER", "ORDERS/COMMIT", "REFUSED COMMITS", "REFUSED GROUPS", "CPU µs/ORDER", "GOROUTINES", "HEAP MiB", "CHECK"}
	for _, row := range r.Rows {
		skus, stock := fmt.Sprint(row.Shape.SKUs), fmt.Sprint(row.Shape.Stock)
		if row.Shape.Stock == bench.Plenty {
			stock = "plenty"
		}
		if row.Shape.Batch > 0 {
			skus, stock = "-", "-"
		}
		truth := "-"
		if row.TruthChecked > 0 {
			truth = fmt.Sprintf("%d/%d untrue", row.Untrue, row.TruthChecked)
		}
		writes, reads := "-", "-"
		if n := row.Orders + row.Refusals; row.Etcd != nil && n > 0 {
			writes, reads = fmt.Sprintf("%.3f", float64(row.Etcd.Writes)/float64(n)), fmt.Sprintf("%.3f", float64(row.Etcd.Reads)/float64(n))
		}
		check := "ok"
		if !row.OK {
			check = "FAILED"
		}
		co := row.Costs
		t.rows = append(t.rows, []string{row.Shape.Name, row.Strategy, skus, stock,
			fmt.Sprintf("%.0f", row.OrdersPerSec), fmt.Sprintf("%.0f", row.LateOrdersPerSec), fmt.Sprintf("%.0f", row.RefusalsPerSec), msText(row.ServedMs.P99),
			msText(row.RefusalMs.P50), msText(row.RefusalMs.P99), fmt.Sprint(row.Releases), fmt.Sprint(row.Errors), truth,
			writes, reads, ratioText(co.KeysPerOrder, 2), ratioText(co.KeysPerLine, 2), ratioText(co.DeletesPerOrder, 2), ratioText(co.ComparesPerOrder, 2),
			ratioText(co.TxnsPerOrder, 3), ratioText(co.OrdersPerCommit, 1), percentText(co.RefusedCommits), percentText(co.RefusedGroups), ratioText(co.CPUMicrosPerOrder, 0), fmt.Sprint(row.Goroutines), fmt.Sprintf("%.0f", row.HeapMiB), check})
	}
	t.notes = append(t.notes, "", "LATE ORDERS/S: orders/s served in the run's second half, its start-up behind it (a process's first",
		"  order of a SKU costs a look and a takeover; over 10,000 SKUs most orders of a short run are first ones);",
		"REFUSALS/S: from the first refusal to the end of the run (the storm after the sell-out);",
		"TRUTH: sampled refusals checked against the books at their revision, which must be at or after the order's start;",
		"ETCD W/ORDER, R/ORDER: etcd write requests (each an fsynced transaction when it commits) and read requests the",
		"  strategy's coordinators and rebalancer sent during the run, per order answered (served or refused);",
		"limit-N: the physical limit, no sale: one writer per process (--limit-writers) putting N new 200-byte keys a transaction; its",
		"  ORDERS/S is puts/s, the most orders/s this etcd could take at one key per order and N orders a commit;",
		"KEYS/ORDER, DELS/ORDER: etcd's own count (etcd_mvcc_put_total, etcd_mvcc_delete_total) over the selling",
		"  window, every writer included (rebalancer moves), per served order; '-' when etcd is not in this process;",
		"KEYS/LINE: KEYS/ORDER per line of the cart shapes' orders (3 SKUs an order, all or none; in cart-mix one order in ten, the rest single orders; '-' elsewhere);",
		"CMPS/ORDER, TXNS/ORDER: the clients' count of compares and write requests, per served order;",
		"ORDERS/COMMIT: served orders per write request etcd applied (etcd_server_apply_duration_seconds' count);",
		"REFUSED COMMITS: the clients' write transactions answered as refused by their compares (or with a nested one refused),",
		"  of all they sent; REFUSED GROUPS: the parts that commit or fail on their own (a commit's nested transactions, one",
		"  per group of orders sharing no key; else the transaction) refused, of all: about the share of orders sent again;",
		"CPU µs/ORDER: this process's CPU time over the selling window (buyers, coordinators and etcd, when etcd runs in it)",
		"  per served order; on a 2-core machine the sale saturates, what bounds its rate;",
		"GOROUTINES, HEAP: the whole bench process at the end of the run (its coordinators, etcd and buyers).")
	for _, row := range r.Rows {
		if len(row.Clusters) > 0 {
			t.notes = append(t.notes, fmt.Sprintf("PER CLUSTER of %s at %s (%.0f orders/s in all; %s):", row.Strategy, row.Shape.Name, row.OrdersPerSec, oneClusterText(r.Rows, row.Shape.Name)))
		}
		for _, cl := range row.Clusters {
			t.notes = append(t.notes, fmt.Sprintf("  %s: SKUs %d (%.1f%%), etcd requests %d (%.1f%%), keys written %d (%.1f%%), deleted %d",
				cl.Cluster, cl.SKUs, 100*cl.SKUShare, cl.Etcd.Reads+cl.Etcd.Writes, 100*cl.RequestShare, cl.Keys, 100*cl.KeyShare, cl.Deletes))
		}
	}
	for _, row := range r.Rows {
		if row.FirstError != "" {
			t.notes = append(t.notes, fmt.Sprintf("FIRST ERROR of %s at %s: %s", row.Strategy, row.Shape.Name, row.FirstError))
		}
	}
	for _, tg := range r.Targets {
		t.notes = append(t.notes, fmt.Sprintf("TARGET %s: %s (%s)", tg.Name, strings.ToUpper(tg.Status), tg.Detail))
	}
	for _, f := range r.Failures {
		t.notes = append(t.notes, "FAILED: "+f)
	}
	return t
}

// oneClusterText is the one-cluster stockctl row's rate at shape, for the
// per-cluster notes.
func oneClusterText(rows []bench.SaleRow, shape string) string {
	for _, r := range rows {
		if r.Shape.Name == shape && r.Strategy == bench.StockctlSale().Name && len(r.Clusters) == 0 {
			return fmt.Sprintf("stockctl on one cluster %.0f orders/s, %d etcd requests", r.OrdersPerSec, etcdRequests(r))
		}
	}
	return "no one-cluster row"
}

func etcdRequests(r bench.SaleRow) int64 {
	if r.Etcd == nil {
		return 0
	}
	return r.Etcd.Reads + r.Etcd.Writes
}

// ratioText writes a ratio with nd decimals, or "-" when there is none.
func ratioText(v *float64, nd int) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.*f", nd, *v)
}

// percentText writes a share as a percentage, or "-".
func percentText(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100**v)
}

// benchEtcd connects one client per process (as separate processes would
// have) to the bench's etcd: --endpoints, or an embedded one started here
// in a temporary directory, a single member or a 3-member loopback cluster.
// stop closes the clients and the embedded etcd.
func benchEtcd(ctx context.Context, g *globals, noFsync bool, members, processes int, opts ...grpc.DialOption) (clients []*clientv3.Client, stop func(), err error) {
	var closers []func()
	stop = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	endpoints := g.endpoints
	if len(endpoints) == 0 {
		dir, err := os.MkdirTemp("", "stockctl-bench-")
		if err != nil {
			return nil, stop, failed(ctx, "create a temporary directory for the bench's etcd", err)
		}
		closers = append(closers, func() { os.RemoveAll(dir) })
		srvs, err := startBenchMembers(ctx, dir, noFsync, members)
		for _, srv := range srvs {
			closers = append(closers, srv.Close)
			endpoints = append(endpoints, srv.Endpoints()...)
		}
		if err != nil {
			return nil, stop, err
		}
	}
	clients = make([]*clientv3.Client, processes)
	closers = append(closers, func() {
		for _, cl := range clients {
			if cl != nil {
				cl.Close()
			}
		}
	})
	for i := range clients {
		if clients[i], err = dial(ctx, g, endpoints, opts...); err != nil {
			return nil, stop, err
		}
	}
	return clients, stop, nil
}

// startBenchMembers starts n embedded etcd members on loopback under dir:
// one with ports of its own choosing, or a cluster whose peer ports are
// chosen here (members must know each other's before they start) and
// which start together (each waits for a quorum).
func startBenchMembers(ctx context.Context, dir string, noFsync bool, n int) ([]*embedetcd.Server, error) {
	if n == 1 {
		srv, err := startEmbedded(ctx, embedetcd.Config{Dir: filepath.Join(dir, "m0"), UnsafeNoFsync: noFsync})
		if err != nil {
			return nil, err
		}
		return []*embedetcd.Server{srv}, nil
	}
	peers := make([]string, n)
	var initial []string
	for i := range peers {
		port, err := freePort()
		if err != nil {
			return nil, failed(ctx, "pick a port for the bench's etcd cluster", err)
		}
		peers[i] = fmt.Sprintf("127.0.0.1:%d", port)
		initial = append(initial, fmt.Sprintf("m%d=http://%s", i, peers[i]))
	}
	srvs := make([]*embedetcd.Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range srvs {
		wg.Go(func() {
			srvs[i], errs[i] = embedetcd.Start(ctx, embedetcd.Config{Dir: filepath.Join(dir, fmt.Sprintf("m%d", i)), Name: fmt.Sprintf("m%d", i),
				PeerAddr: peers[i], InitialCluster: strings.Join(initial, ","), UnsafeNoFsync: noFsync})
		})
	}
	wg.Wait()
	var up []*embedetcd.Server
	for _, s := range srvs {
		if s != nil {
			up = append(up, s)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return up, failed(ctx, "start the bench's 3-member etcd cluster", err)
	}
	return up, nil
}

// freePort is a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

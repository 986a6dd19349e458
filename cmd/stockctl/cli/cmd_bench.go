package cli

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/cmd/stockctl/bench"
	"github.com/stockctl/stockctl/segments"
)

// benchDefaultRuns are bench's shapes: a single lock (the baseline),
// then the targets' shapes (20 segments with 40 and with 200 buyers, 100
// segments with 200).
const benchDefaultRuns = "1x2,20x40,20x200,100x200"

// benchDefaultSegments are the segment counts when only --buyers is given.
const benchDefaultSegments = "1,20,100"

// benchIssueEtcd is the etcd the targets are measured on.
const benchIssueEtcd = "embedded, fsync on"

// maxBenchBuyers bounds a run's buyers (goroutines; their route keys are
// searched for one by one).
const maxBenchBuyers = 100000

func benchCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "bench",
		Usage: "compare ways of selling one hot SKU under the same load",
		Description: "Runs each strategy in turn at each shape (segments × buyers, --runs), with the same closed-loop buyers\n" +
			"spread evenly over the segments and over --processes etcd clients, for --duration or --orders, whichever\n" +
			"comes first. Shapes of one segment count run next to each other, and the strategies one after another\n" +
			"at each shape, so that the runs compared at one shape are close in time. The strategies:\n" +
			"  one-lock         one etcd concurrency.Mutex around the whole stock (the baseline)\n" +
			"  etcd-mutex       a stock concurrency.Mutex per segment, one session per buyer (the naive etcd way)\n" +
			"  stockctl         stockctl's coordinators (AllocateFunc), rebalancer and pool\n" +
			"  stockctl-nostep  stockctl's Allocate with no business step (pure allocation, group commit)\n" +
			"  stockctl-reserve stockctl's Reserve then Confirm, no business step (the checkout flow: two commits)\n" +
			"  stockctl-api     stockctl-nostep through the network API: --processes `stockctl serve` OS processes on the\n" +
			"                   bench's etcd, the buyers gRPC clients (only when named in --strategies)\n" +
			"and with --redis HOST:PORT (a binary built from the benchredis module):\n" +
			"  redsync          a redsync lock per segment with the same business step\n" +
			"  redis-lua        a Lua \"decrement if enough\" on one key (the common seckill way)\n" +
			"Each run's books are read afterwards: nothing may be oversold, and what the buyers were served must\n" +
			"match the orders recorded. The ideal of a strategy with a step is places ÷ step (segments ÷ step, or\n" +
			"1 ÷ step for one lock). stockctl's runs also time refills: from a segment's stock falling below its low\n" +
			"watermark to stock arriving in its inbox. The performance targets are judged on the rows that ran.\n" +
			"Exit 1 if any run's check fails (a target not met does not fail the bench).\n" +
			"Without --endpoints it runs on an embedded etcd (fsync on) in a temporary directory, removed at the end.",
		Flags: append([]ucli.Flag{
			&ucli.StringFlag{Name: "runs", Value: benchDefaultRuns, EnvVars: []string{"STOCKCTL_BENCH_RUNS"},
				Usage: "shapes to run, comma-separated SEGMENTSxBUYERS (not with --segments or --buyers)"},
			&ucli.StringFlag{Name: "segments", EnvVars: []string{"STOCKCTL_BENCH_SEGMENTS"},
				Usage: "instead of --runs: segment counts, comma-separated, each run with --buyers (" + benchDefaultSegments + " when only --buyers is given)"},
			&ucli.IntFlag{Name: "buyers", EnvVars: []string{"STOCKCTL_BENCH_BUYERS"},
				Usage: fmt.Sprintf("instead of --runs: concurrent buyers of every --segments count (0: %d per segment, at least 2, at most %d)",
					bench.DefaultBuyersPerSegment, bench.MaxDefaultBuyers)},
			&ucli.DurationFlag{Name: "step", Value: bench.DefaultStep, EnvVars: []string{"STOCKCTL_BENCH_STEP"},
				Usage: "business step each order runs while holding its lock (strategies with a step)"},
			&ucli.DurationFlag{Name: "duration", Value: bench.DefaultDuration, EnvVars: []string{"STOCKCTL_BENCH_DURATION"},
				Usage: "length of each run"},
			&ucli.Int64Flag{Name: "orders", Value: bench.DefaultOrders, EnvVars: []string{"STOCKCTL_BENCH_ORDERS"},
				Usage: "most orders of each run"},
			&ucli.StringFlag{Name: "strategies", EnvVars: []string{"STOCKCTL_BENCH_STRATEGIES"},
				Usage: "strategies to run, comma-separated (default: all available but stockctl-api)"},
			benchServeBinFlag(),
			&ucli.IntFlag{Name: "processes", Value: bench.DefaultProcesses, EnvVars: []string{"STOCKCTL_BENCH_PROCESSES"},
				Usage: "etcd clients (coordinators, Redis clients) the buyers are spread over, as separate processes would be"},
			&ucli.StringFlag{Name: "affinity", Value: string(bench.Spread), EnvVars: []string{"STOCKCTL_BENCH_AFFINITY"},
				Usage: "how buyers sit in processes: spread (a segment's buyers in different processes, every lock handoff " +
					"crosses processes) or segment (a segment's buyers in one process, as a load balancer routing by the segment hash)"},
			&ucli.StringFlag{Name: "redis", EnvVars: []string{"STOCKCTL_BENCH_REDIS"},
				Usage: "loopback HOST:PORT of a Redis server: also run the Redis peers (needs the benchredis build)"},
			&ucli.StringFlag{Name: "plot", EnvVars: []string{"STOCKCTL_BENCH_PLOT"},
				Usage: "write an SVG plot of orders/s against segment count to this file"},
			&ucli.BoolFlag{Name: "unsafe-no-fsync", EnvVars: []string{"STOCKCTL_BENCH_UNSAFE_NO_FSYNC"},
				Usage: "run the embedded etcd without fsync (faster, not what production does)"},
			&ucli.DurationFlag{Name: "attempt-timeout", Value: bench.DefaultAttemptTimeout,
				Usage: "give up an attempt at an order after this long and retry it under the same order ID"},
			&ucli.StringFlag{Name: "progress", Value: "auto", EnvVars: []string{"STOCKCTL_PROGRESS"},
				Usage: "live progress line on stderr: auto (when stderr is a terminal), always or never"},
			&ucli.IntFlag{Name: "cluster", Value: 1, EnvVars: []string{"STOCKCTL_BENCH_CLUSTER"},
				Usage: "members of the embedded etcd: 1, or 3 for a loopback cluster (what replication costs)"},
		}, saleFlags()...),
		Action: benchAction,
	}
}

// benchConfig is bench's validated flags (part of its -o json output).
type benchConfig struct {
	// Runs are the shapes, in the order they run, default buyer counts
	// resolved.
	Runs            []bench.Shape `json:"runs"`
	StepMs          float64       `json:"stepMs"`
	DurationSeconds float64       `json:"durationSeconds"`
	Orders          int64         `json:"orders"`
	Processes       int           `json:"processes"`
	Affinity        string        `json:"affinity"`
	Strategies      []string      `json:"strategies"`
	Etcd            string        `json:"etcd"`
	Redis           string        `json:"redis,omitempty"`

	step, duration, attemptTimeout time.Duration
	names                          []string
	noFsync                        bool
	cluster                        int
	plot, progress                 string
	serve                          bench.Serve // stockctl-api's processes
}

func readBenchConfig(c *ucli.Context, g *globals) (benchConfig, error) {
	b := benchConfig{step: c.Duration("step"), duration: c.Duration("duration"), Orders: c.Int64("orders"),
		Processes: c.Int("processes"), Affinity: c.String("affinity"), Redis: c.String("redis"), plot: c.String("plot"), noFsync: c.Bool("unsafe-no-fsync"),
		attemptTimeout: c.Duration("attempt-timeout"), progress: c.String("progress"), cluster: c.Int("cluster")}
	b.StepMs, b.DurationSeconds = ms(b.step), b.duration.Seconds()
	if c.NArg() > 0 {
		return b, usageError("bench takes no arguments, got %q", c.Args().Slice())
	}
	runs, err := benchRuns(c)
	if err != nil {
		return b, err
	}
	if b.serve, err = benchServe(c); err != nil {
		return b, err
	}
	b.Runs = runs
	for _, f := range strings.Split(c.String("strategies"), ",") {
		if f = strings.TrimSpace(f); f != "" {
			b.names = append(b.names, f)
		}
	}
	switch {
	case b.step <= 0:
		return b, usageError("invalid --step %v: must be positive (stockctl-nostep and redis-lua run without one)", b.step)
	case b.duration <= 0:
		return b, usageError("invalid --duration %v: must be positive", b.duration)
	case b.Orders < 1:
		return b, usageError("invalid --orders %d: must be at least 1", b.Orders)
	case b.Processes < 1 || b.Processes > 64:
		return b, usageError("invalid --processes %d: must be between 1 and 64", b.Processes)
	case b.Affinity != string(bench.Spread) && b.Affinity != string(bench.SegmentAffinity):
		return b, usageError("invalid --affinity %q: want %s or %s", b.Affinity, bench.Spread, bench.SegmentAffinity)
	case b.attemptTimeout <= 0:
		return b, usageError("invalid --attempt-timeout %v: must be positive", b.attemptTimeout)
	case b.plot != "" && !strings.HasSuffix(strings.ToLower(b.plot), ".svg"):
		return b, usageError("invalid --plot %q: the plot is SVG, name a .svg file", b.plot)
	case b.progress != "auto" && b.progress != "always" && b.progress != "never":
		return b, usageError("invalid --progress %q: want auto, always or never", b.progress)
	case b.cluster != 1 && b.cluster != 3:
		return b, usageError("invalid --cluster %d: want 1 or 3 embedded etcd members", b.cluster)
	case b.cluster != 1 && len(g.endpoints) > 0:
		return b, usageError("--cluster starts an embedded etcd: it cannot be given with --endpoints")
	}
	if b.Redis != "" {
		if err := checkLoopback(b.Redis); err != nil {
			return b, usageError("invalid --redis %q: %v", b.Redis, err)
		}
	}
	switch {
	case len(g.endpoints) > 0:
		b.Etcd = "--endpoints " + strings.Join(g.endpoints, ",")
	case b.noFsync:
		b.Etcd = "embedded, fsync off"
	default:
		b.Etcd = benchIssueEtcd
	}
	if b.cluster == 3 {
		b.Etcd = strings.Replace(b.Etcd, "embedded", "embedded 3-member cluster (loopback)", 1)
	}
	return b, nil
}

// benchRuns reads the shapes: --runs, or the cross product of --segments
// and --buyers when either is given (and --runs is not), in the order
// bench.Run runs them, so that the config shows what runs.
func benchRuns(c *ucli.Context) ([]bench.Shape, error) {
	var runs []bench.Shape
	if c.IsSet("segments") || c.IsSet("buyers") {
		if c.IsSet("runs") {
			return nil, usageError("--runs cannot be given with --segments or --buyers: --runs names each run's segments and buyers " +
				"(e.g. --runs 20x40,20x200), --segments with --buyers runs every segment count with one buyer count")
		}
		buyers := c.Int("buyers")
		if buyers < 0 || buyers > maxBenchBuyers {
			return nil, usageError("invalid --buyers %d: must be between 1 and %d (0: %d per segment)", buyers, maxBenchBuyers, bench.DefaultBuyersPerSegment)
		}
		list := c.String("segments")
		if !c.IsSet("segments") {
			list = benchDefaultSegments
		}
		for _, f := range strings.Split(list, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > segments.MaxSegments {
				return nil, usageError("invalid --segments %q: entry %q: want comma-separated counts from 1 to %d", list, f, segments.MaxSegments)
			}
			sh := bench.Shape{Segments: n, Buyers: buyers}
			if slices.ContainsFunc(runs, func(o bench.Shape) bool { return o.Segments == n }) {
				return nil, usageError("invalid --segments %q: %d is given twice", list, n)
			}
			runs = append(runs, sh)
		}
	} else {
		list := c.String("runs")
		for _, f := range strings.Split(list, ",") {
			sh, err := parseShape(strings.TrimSpace(f))
			if err != nil {
				return nil, usageError("invalid --runs %q: entry %q: %v", list, f, err)
			}
			if slices.Contains(runs, sh) {
				return nil, usageError("invalid --runs %q: entry %q is given twice", list, f)
			}
			runs = append(runs, sh)
		}
	}
	return bench.RunOrder(runs), nil
}

// parseShape reads SEGMENTSxBUYERS (e.g. 20x40).
func parseShape(s string) (bench.Shape, error) {
	segs, buyers, ok := strings.Cut(strings.ToLower(s), "x")
	if !ok {
		return bench.Shape{}, errors.New("want SEGMENTSxBUYERS, e.g. 20x40")
	}
	n, err := strconv.Atoi(segs)
	if err != nil || n < 1 || n > segments.MaxSegments {
		return bench.Shape{}, fmt.Errorf("segments must be a count from 1 to %d", segments.MaxSegments)
	}
	b, err := strconv.Atoi(buyers)
	if err != nil || b < 1 || b > maxBenchBuyers {
		return bench.Shape{}, fmt.Errorf("buyers must be a count from 1 to %d", maxBenchBuyers)
	}
	return bench.Shape{Segments: n, Buyers: b}, nil
}

// checkLoopback accepts host:port on a loopback address only: the bench
// sends load, and load goes nowhere but this machine.
func checkLoopback(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want HOST:PORT: %v", err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("bad port %q", port)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address (127.0.0.0/8, ::1, localhost): the bench only loads this machine", host)
	}
	return nil
}

// benchSpecs are the strategies to run: this module's, the Redis peers'
// with --redis, filtered by --strategies.
func benchSpecs(b benchConfig) ([]bench.Spec, error) {
	specs := []bench.Spec{bench.OneLock(), bench.EtcdMutex(), bench.Stockctl(), bench.StockctlNoStep(), bench.StockctlReserve(), bench.StockctlAPI(b.serve)}
	if b.Redis != "" {
		more, err := bench.RedisSpecs(b.Redis)
		if errors.Is(err, bench.ErrNoRedis) {
			return nil, usageError("--redis: this stockctl was built without the Redis peers; build the benchredis module's binary " +
				"(cd benchredis && go build -o stockctl-bench ./cmd/stockctl-bench) or run scripts/bench-redis.sh")
		}
		if err != nil {
			return nil, usageError("--redis: %v", err)
		}
		specs = append(specs, more...)
	}
	specs, err := bench.Select(specs, b.names)
	if err != nil {
		return nil, usageError("invalid --strategies: %v", err)
	}
	if len(b.names) == 0 {
		specs = withoutOptIn(specs)
	}
	return specs, nil
}

func benchAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	if c.Bool("sale") {
		return benchSaleAction(c, g)
	}
	b, err := readBenchConfig(c, g)
	if err != nil {
		return err
	}
	specs, err := benchSpecs(b)
	if err != nil {
		return err
	}
	for _, s := range specs {
		b.Strategies = append(b.Strategies, s.Name)
	}
	ctx, stop := signalContext(c)
	defer stop()

	sctx, cancelSetup := g.boundedContext(ctx)
	defer cancelSetup()
	clients, closeEtcd, err := benchEtcd(sctx, g, b.noFsync, b.cluster, b.Processes)
	if err != nil {
		return err
	}
	defer closeEtcd()
	cancelSetup()

	prefix := strings.TrimSuffix(g.prefix, "/") + "/bench-" + time.Now().UTC().Format("20060102-150405") + "/"
	report := benchReport{Config: b, Machine: bench.ReadMachine(), Failures: []string{}}
	if g.output == outputTable {
		fmt.Fprintf(c.App.Writer, "bench: %s at %s (segments x buyers), %v step, %v or %d orders per run, %d processes (%s), etcd %s\n\n",
			strings.Join(b.Strategies, ", "), shapesText(b.Runs), b.step, b.duration, b.Orders, b.Processes, b.Affinity, b.Etcd)
	}
	pl := newBenchProgress(c.App.ErrWriter, b.progress)
	rows, runErr := bench.Run(ctx, bench.Config{
		Specs: specs, Shapes: b.Runs, Step: b.step, Duration: b.duration, Orders: b.Orders,
		Processes: b.Processes, Affinity: bench.Affinity(b.Affinity), Etcd: clients, Prefix: prefix, AttemptTimeout: b.attemptTimeout, Progress: pl.update,
	})
	pl.clear()
	report.Machine.LoadAvgEnd = bench.LoadAvg()
	report.Rows = rows
	if report.Rows == nil {
		report.Rows = []bench.Row{}
	}
	report.Targets = bench.Targets(rows)
	for _, r := range rows {
		for _, p := range r.Problems {
			report.Failures = append(report.Failures, fmt.Sprintf("%s at %d segments x %d buyers: %s", r.Strategy, r.Segments, r.Buyers, p))
		}
	}
	report.OK = len(report.Failures) == 0 && runErr == nil
	if b.plot != "" && len(rows) > 0 {
		if err := writePlot(b.plot, rows, b); err != nil {
			return failed(ctx, "write the plot", err)
		}
	}
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

func writePlot(path string, rows []bench.Row, b benchConfig) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	title := fmt.Sprintf("One hot SKU: %v step, %d processes (%s)", b.step, b.Processes, b.Affinity)
	return bench.WriteSVG(f, rows, title)
}

func shapesText(shapes []bench.Shape) string {
	s := make([]string, len(shapes))
	for i, sh := range shapes {
		s[i] = sh.String()
	}
	return strings.Join(s, ",")
}

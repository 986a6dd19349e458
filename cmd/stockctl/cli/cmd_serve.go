package cli

import (
	"fmt"
	"net"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/console"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/embedetcd"
	"github.com/stockctl/stockctl/service"
)

// DefaultListen is where serve's embedded etcd listens for clients: etcd's
// usual client port, on loopback.
const DefaultListen = "127.0.0.1:2379"

// DefaultAutoCompactionRetention is how much history serve's embedded etcd
// keeps: every hour or so it compacts what is older. etcd keeps every
// revision of every key until compacted, and each order writes several, so
// without it the database reaches its quota and etcd refuses every write
// (docs/operations.md). Cost: `audit --revision` and watches that fell
// further behind than this cannot go back that far (a watch reloads).
const DefaultAutoCompactionRetention = time.Hour

func serveCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "serve",
		Usage: "serve stockctl's network API (gRPC, gRPC-Web, HTTP/JSON) and run the elected rebalancer, until interrupted",
		Description: "Serves the stockctl.v1 API (docs/api.md) on --api-addr for services in any language, and runs a\n" +
			"rebalancer candidate: of several serve processes sharing an etcd, one rebalancer leads.\n" +
			"With --endpoints (and --cacert/--cert/--key, --user, --prefix) it uses that etcd cluster, which any\n" +
			"number of serve processes may share. Without, it starts an embedded etcd on --listen (loopback only,\n" +
			"no TLS or authentication) with its data in --data-dir; other stockctl processes share it with\n" +
			"--endpoints http://ADDRESS (or STOCKCTL_ENDPOINTS).\n" +
			"The API may listen beyond loopback only with TLS (--api-cert, --api-key) and client authentication\n" +
			"(--api-tokens and/or --api-client-ca); serve refuses otherwise (exit 2) and names what is missing.\n" +
			"SIGTERM or ^C: health turns NOT_SERVING, streams end, calls in flight get 10 s, locks held for\n" +
			"remote callers are released, then the coordinator's locks and lease.",
		ArgsUsage: "[--api-addr 127.0.0.1:7070] [--listen 127.0.0.1:2379]",
		Flags: append([]ucli.Flag{
			&ucli.StringFlag{Name: "listen", Value: DefaultListen, EnvVars: []string{"STOCKCTL_LISTEN"},
				Usage: "loopback host:port for the embedded etcd's clients (not with --endpoints)"},
			identityFlag(),
			metricsAddrFlag(),
			&ucli.DurationFlag{Name: "auto-compaction-retention", Value: DefaultAutoCompactionRetention, EnvVars: []string{"STOCKCTL_AUTO_COMPACTION_RETENTION"},
				Usage: "the embedded etcd compacts history older than this, periodically (0: never; not with --endpoints, where the cluster's own flag rules)"},
			&ucli.Int64Flag{Name: "quota-backend-bytes", EnvVars: []string{"STOCKCTL_QUOTA_BACKEND_BYTES"},
				Usage: "the embedded etcd's database quota: beyond it etcd refuses writes (alarm NOSPACE) (0: etcd's default, 2 GiB; not with --endpoints)"},
		}, apiFlags()...),
		Action: serveAction,
	}
}

// serveView says where serve's etcd and API are.
type serveView struct {
	Endpoints []string `json:"endpoints"`
	// DataDir is the embedded etcd's; "" with --endpoints.
	DataDir string `json:"dataDir"`
	Prefix  string `json:"prefix"`
	// API is the API's base URL: http://HOST:PORT, or https:// with TLS.
	API string `json:"api"`
}

func (v serveView) table() table {
	var t table
	t.add("API", v.API)
	t.add("ETCD", strings.Join(v.Endpoints, ","))
	if v.DataDir != "" {
		t.add("DATA DIR", v.DataDir)
	}
	t.add("PREFIX", v.Prefix)
	t.notes = append(t.notes, fmt.Sprintf("other processes: export STOCKCTL_ENDPOINTS=%s", strings.Join(v.Endpoints, ",")))
	return t
}

func serveAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	if c.NArg() > 0 {
		return usageError("serve takes no arguments, got %q", c.Args().Slice())
	}
	listen := c.String("listen")
	// With --endpoints or --cluster serve uses those clusters and starts no
	// etcd of its own.
	external := len(g.endpoints) > 0 || len(g.clusters) > 0
	if external {
		for _, f := range []string{"listen", "auto-compaction-retention", "quota-backend-bytes"} {
			if c.IsSet(f) {
				return usageError("--%s is the embedded etcd's: with --endpoints serve uses that etcd and starts none (and with --cluster those clusters)", f)
			}
		}
	} else {
		host, _, err := net.SplitHostPort(listen)
		if err != nil {
			return usageError("invalid --listen %q: want host:port", listen)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return usageError("invalid --listen %q: must be a loopback address (127.0.0.1, ::1 or localhost)", listen)
		}
	}
	retention, quota := c.Duration("auto-compaction-retention"), c.Int64("quota-backend-bytes")
	if retention < 0 || (retention > 0 && retention < time.Second) {
		return usageError("invalid --auto-compaction-retention %v: 0 (never) or at least 1s", retention)
	}
	if quota < 0 {
		return usageError("invalid --quota-backend-bytes %d: must not be negative (0: etcd's default)", quota)
	}
	// Everything the API needs is read and checked before anything starts:
	// a bad flag is exit 2 with nothing listening.
	api, err := readAPIFlags(c)
	if err != nil {
		return err
	}

	metrics, err := startMetrics(c, c.App.ErrWriter)
	if err != nil {
		return err
	}
	defer metrics.close()
	ctx, stop := signalContext(c)
	defer stop()
	sctx, cancel := g.boundedContext(ctx)
	defer cancel()
	// A service that sells: SKUs created while it runs are born with its
	// home segment named to it (coordinator.WithSellerSeat).
	opts := []coordinator.Option{coordinator.WithSellerSeat()}
	if reg := metrics.registerer(); reg != nil {
		opts = append(opts, coordinator.WithMetrics(reg))
	}
	view := serveView{Prefix: g.prefix}
	var cn *conn
	if external {
		view.Endpoints = g.endpoints
		if cn, err = connect(sctx, c, g, opts...); err != nil {
			return err
		}
	} else {
		ecfg := embedetcd.Config{Dir: g.dataDir, ClientAddr: listen, QuotaBackendBytes: quota}
		if retention > 0 {
			ecfg.AutoCompactionRetention = retention.String()
		}
		embedded, err := startEmbedded(sctx, ecfg)
		if err != nil {
			return err
		}
		defer embedded.Close() // after cn.Close
		view.Endpoints, view.DataDir = embedded.Endpoints(), g.dataDir
		// The coordinator connects like any other client would.
		sg := *g
		sg.endpoints = embedded.Endpoints()
		if cn, err = connect(sctx, c, &sg, opts...); err != nil {
			return err
		}
	}
	defer cn.Close() // after the API's Close
	cancel()
	if reg := metrics.registerer(); reg != nil {
		registerEtcdCollectors(reg, cn)
	}

	api.cfg.Registerer = metrics.registerer()
	api.cfg.Logger = g.logger(c.App.ErrWriter)
	apiSrv, err := service.New(cn.coord, api.cfg)
	if err != nil {
		return failed(ctx, "set up the API", err)
	}
	// Deferred after cn.Close, so it runs first: the locks held for
	// remote callers are released while the coordinator is still there.
	defer apiSrv.Close()
	ln, err := net.Listen("tcp", api.addr)
	if err != nil {
		return ucli.Exit(fmt.Errorf("failed to listen for the API on %s: %w (another stockctl serve? give --api-addr another port; 127.0.0.1:0 picks a free one)",
			api.addr, err), ExitFailure)
	}
	view.API = api.scheme() + ln.Addr().String()
	// One line of JSON: the moves that follow are one JSON object a line.
	if err := showLine(c, g, view); err != nil {
		_ = ln.Close()
		return err
	}
	fmt.Fprintf(c.App.ErrWriter, "api on %s (gRPC, gRPC-Web, Connect and JSON over HTTP; %s)\n", view.API, api.describe())
	if api.cfg.Console {
		fmt.Fprintf(c.App.ErrWriter, "console on %s%s (open it in a browser; it asks for an API token if the API needs one)\n", view.API, console.Path)
	}
	return runService(ctx, c, cn, apiSrv, ln, newMovePrinter(c.App.Writer, g.output), metrics.registerer())
}

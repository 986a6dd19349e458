package cli

import (
	"fmt"
	"net"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/embedetcd"
)

// DefaultListen is where serve's etcd listens for clients: etcd's usual
// client port, on loopback.
const DefaultListen = "127.0.0.1:2379"

func serveCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "serve",
		Usage: "run an embedded etcd on a loopback address, plus the rebalancer, until interrupted",
		Description: "Other stockctl processes share it with --endpoints http://ADDRESS (or STOCKCTL_ENDPOINTS).\n" +
			"Data lives in --data-dir. Only loopback addresses are accepted: the embedded etcd has no TLS\n" +
			"or authentication configured; use a real etcd cluster for anything else.",
		ArgsUsage: "[--listen 127.0.0.1:2379]",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "listen", Value: DefaultListen, EnvVars: []string{"STOCKCTL_LISTEN"},
				Usage: "loopback host:port for etcd's clients"},
			identityFlag(),
			metricsAddrFlag(),
		},
		Action: serveAction,
	}
}

// serveView says where serve's etcd is.
type serveView struct {
	Endpoints []string `json:"endpoints"`
	DataDir   string   `json:"dataDir"`
	Prefix    string   `json:"prefix"`
}

func (v serveView) table() table {
	var t table
	t.add("ETCD", strings.Join(v.Endpoints, ","))
	t.add("DATA DIR", v.DataDir)
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
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return usageError("invalid --listen %q: want host:port", listen)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return usageError("invalid --listen %q: must be a loopback address (127.0.0.1, ::1 or localhost)", listen)
	}
	if len(g.endpoints) > 0 {
		return usageError("serve runs its own etcd and cannot use --endpoints; to run only the rebalancer against a cluster, use `stockctl --endpoints ... rebalance --watch`")
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
	srv, err := startEmbedded(sctx, embedetcd.Config{Dir: g.dataDir, ClientAddr: listen})
	if err != nil {
		return err
	}
	defer srv.Close()
	// The rebalancer connects like any other client would.
	sg := *g
	sg.endpoints = srv.Endpoints()
	var opts []coordinator.Option
	if reg := metrics.registerer(); reg != nil {
		opts = append(opts, coordinator.WithMetrics(reg))
	}
	cn, err := connect(sctx, c, &sg, opts...)
	if err != nil {
		return err
	}
	defer cn.Close()
	cancel()
	// One line of JSON: the moves that follow are one JSON object a line.
	if err := showLine(c, g, serveView{Endpoints: srv.Endpoints(), DataDir: g.dataDir, Prefix: g.prefix}); err != nil {
		return err
	}
	return runRebalancer(ctx, c, cn, newMovePrinter(c.App.Writer, g.output), metrics.registerer())
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	ucli "github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/embedetcd"
	"github.com/stockctl/stockctl/internal/etcdcall"
)

// conn is a command's connection to etcd: a client, a coordinator on it,
// and the embedded etcd serving them when no --endpoints were given.
type conn struct {
	g         *globals
	server    *embedetcd.Server // nil with --endpoints
	endpoints []string
	client    *clientv3.Client   // with --cluster: the first cluster's
	clients   []*clientv3.Client // with --cluster: every cluster's
	coord     *coordinator.Coordinator
}

// connect reaches etcd (starting the embedded one in --data-dir when no
// --endpoints are given) and makes a coordinator. ctx bounds the start of
// the embedded etcd; reaching etcd is bounded by --dial-timeout. Errors are
// ready to return from an action.
func connect(ctx context.Context, c *ucli.Context, g *globals, opts ...coordinator.Option) (*conn, error) {
	cn := &conn{g: g, endpoints: g.endpoints}
	opts = append([]coordinator.Option{coordinator.WithPrefix(g.prefix), coordinator.WithLogger(g.logger(c.App.ErrWriter)),
		coordinator.WithIdentity(g.identity), coordinator.WithSpaceGuard(g.spaceGuard)}, opts...)
	if g.eager {
		opts = append(opts, coordinator.WithEagerSegments())
	}
	if len(g.clusters) > 0 {
		if err := connectClusters(ctx, c, g, cn, opts); err != nil {
			cn.Close()
			return nil, err
		}
		return cn, nil
	}
	if len(cn.endpoints) == 0 {
		_, statErr := os.Stat(g.dataDir)
		srv, err := startEmbedded(ctx, embedetcd.Config{Dir: g.dataDir})
		if err != nil {
			return nil, err
		}
		cn.server = srv
		cn.endpoints = srv.Endpoints()
		if errors.Is(statErr, fs.ErrNotExist) {
			// Else a command run in another directory finds "no SKUs" and
			// says nothing of why.
			fmt.Fprintf(c.App.ErrWriter, "stockctl: note: no data dir %s here: created a new, empty embedded etcd in it "+
				"(to reach existing stock, run where its data dir is, or give --data-dir or --endpoints)\n", g.dataDir)
		}
	}
	client, err := dial(ctx, g, cn.endpoints)
	if err != nil {
		cn.Close()
		return nil, err
	}
	cn.client = client
	if err := refuseFleetMember(ctx, g, client, cn.endpoints); err != nil {
		cn.Close()
		return nil, err
	}
	coord, err := coordinator.New(client, opts...)
	if err != nil {
		cn.Close()
		return nil, failed(ctx, "set up the coordinator", err)
	}
	cn.coord = coord
	return cn, nil
}

// Close closes the coordinator (releasing its locks and lease), the client
// and the embedded etcd, in that order.
func (cn *conn) Close() {
	if cn.coord != nil {
		_ = cn.coord.Close()
	}
	switch {
	case cn.clients != nil:
		for _, cl := range cn.clients {
			_ = cl.Close()
		}
	case cn.client != nil:
		_ = cn.client.Close()
	}
	if cn.server != nil {
		cn.server.Close()
	}
}

// startEmbedded starts the embedded etcd, turning a data dir held by
// another process into a message that says what to do.
func startEmbedded(ctx context.Context, cfg embedetcd.Config) (*embedetcd.Server, error) {
	srv, err := embedetcd.Start(ctx, cfg)
	switch {
	case errors.Is(err, embedetcd.ErrDataDirInUse):
		return nil, ucli.Exit(fmt.Errorf("failed to start the embedded etcd: %w; another stockctl (a `stockctl serve`?) is using it: "+
			"point --endpoints at that one's etcd, or use another --data-dir", err), ExitFailure)
	case err != nil:
		return nil, failed(ctx, "start the embedded etcd in "+cfg.Dir, err)
	}
	return srv, nil
}

// dial connects a client to endpoints and checks, within --dial-timeout,
// that etcd answers (and accepts the credentials) under the prefix.
func dial(ctx context.Context, g *globals, endpoints []string, opts ...grpc.DialOption) (*clientv3.Client, error) {
	who := "etcd at " + strings.Join(endpoints, ",")
	if g.user != "" {
		who += " as user " + g.user
	}
	dctx, cancel := context.WithTimeout(ctx, g.dialTimeout)
	defer cancel()
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: g.dialTimeout,
		TLS:         g.tls,
		Username:    g.user,
		Password:    g.password,
		// The client logs every retry at warn level; stockctl reports the
		// errors that matter itself.
		Logger:      quietLogger(),
		DialOptions: opts,
	})
	if err != nil {
		return nil, failed(dctx, "connect to "+who, err)
	}
	// clientv3.New does not wait for a connection; one read of the prefix
	// key proves etcd answers and that the user may read there.
	if _, err := etcdcall.KV(client).Get(dctx, g.prefix, clientv3.WithCountOnly()); err != nil {
		client.Close()
		if dctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w (no answer within --dial-timeout %v)", err, g.dialTimeout)
		}
		return nil, failed(ctx, "reach "+who, err)
	}
	return client, nil
}

// withConn runs f on a fresh connection under the command's ctx
// (--timeout, interrupts), and closes everything after.
func withConn(c *ucli.Context, g *globals, f func(ctx context.Context, cn *conn) error) error {
	ctx, cancel := g.commandContext(c)
	defer cancel()
	cn, err := connect(ctx, c, g)
	if err != nil {
		return err
	}
	defer cn.Close()
	return f(ctx, cn)
}

// quietLogger is the etcd clients' logger: none.
func quietLogger() *zap.Logger { return zap.NewNop() }

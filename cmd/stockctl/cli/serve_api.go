package cli

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/service"
)

// DefaultAPIAddr is where serve's network API listens by default: on
// loopback, where it may run without TLS or tokens, reachable from this
// machine only (a sidecar next to the application). Beyond loopback it
// needs --api-cert, --api-key and client authentication.
const DefaultAPIAddr = "127.0.0.1:7070"

func apiFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "api-addr", Value: DefaultAPIAddr, EnvVars: []string{"STOCKCTL_API_ADDR"},
			Usage: "host:port of the network API (gRPC, gRPC-Web, Connect, JSON over HTTP); port 0 picks a free one. " +
				"Beyond loopback only with --api-cert/--api-key and --api-tokens and/or --api-client-ca"},
		&ucli.StringFlag{Name: "api-tokens", EnvVars: []string{"STOCKCTL_API_TOKENS"},
			Usage: "file of the bearer tokens the API accepts, one a line (at least 16 bytes; # comments); " +
				"every call but the health check must send one. Default: no token needed"},
		&ucli.StringFlag{Name: "api-cert", EnvVars: []string{"STOCKCTL_API_CERT"},
			Usage: "the API's TLS certificate (PEM, with --api-key): the API speaks TLS"},
		&ucli.StringFlag{Name: "api-key", EnvVars: []string{"STOCKCTL_API_KEY"},
			Usage: "the API's TLS private key (PEM, with --api-cert)"},
		&ucli.StringFlag{Name: "api-client-ca", EnvVars: []string{"STOCKCTL_API_CLIENT_CA"},
			Usage: "CA bundle (PEM) client certificates must chain to: every API connection must present one (mTLS; needs --api-cert)"},
		&ucli.IntFlag{Name: "api-max-inflight", Value: service.DefaultMaxInflight, EnvVars: []string{"STOCKCTL_API_MAX_INFLIGHT"},
			Usage: "short API calls (unary, but lock Acquire) running at once; beyond it calls are refused at once " +
				"with RESOURCE_EXHAUSTED (OVERLOADED), never queued"},
		&ucli.BoolFlag{Name: "console", EnvVars: []string{"STOCKCTL_CONSOLE"},
			Usage: "serve the live sale console (a web page) under /console/ on the API's address, with the API's TLS; " +
				"it reads through the API with the token the user enters"},
	}
}

// apiSettings are serve's validated API flags.
type apiSettings struct {
	addr     string
	cfg      service.Config // Registerer and Logger are set by serve
	clientCA bool
}

// readAPIFlags reads and checks the API's flags: the tokens file, the TLS
// files and the address policy (service.CheckListen). Every problem is a
// usage error (exit 2) that names the flag; nothing is started. No error
// ever holds a token (service.LoadTokens names lines, not tokens).
func readAPIFlags(c *ucli.Context) (apiSettings, error) {
	a := apiSettings{addr: c.String("api-addr"), clientCA: c.String("api-client-ca") != ""}
	if _, _, err := net.SplitHostPort(a.addr); err != nil {
		return a, usageError("invalid --api-addr %q: want host:port, e.g. %s", a.addr, DefaultAPIAddr)
	}
	n := c.Int("api-max-inflight")
	if n < 1 {
		return a, usageError("invalid --api-max-inflight %d: must be at least 1", n)
	}
	a.cfg.MaxInflight = n
	a.cfg.Console = c.Bool("console")
	cert, key := c.String("api-cert"), c.String("api-key")
	switch {
	case (cert == "") != (key == ""):
		return a, usageError("--api-cert and --api-key must be given together")
	case a.clientCA && cert == "":
		return a, usageError("--api-client-ca needs --api-cert and --api-key: client certificates are checked in TLS")
	}
	if path := c.String("api-tokens"); path != "" {
		tokens, err := service.LoadTokens(path)
		if err != nil {
			return a, usageError("invalid --api-tokens: %v", err)
		}
		a.cfg.Tokens = tokens
	}
	if cert != "" {
		tc, err := service.LoadTLS(cert, key, c.String("api-client-ca"))
		if err != nil {
			return a, usageError("invalid --api-cert/--api-key/--api-client-ca: %v", err)
		}
		a.cfg.TLS = tc
	}
	if err := service.CheckListen(a.addr, a.cfg); err != nil {
		var missing []string
		if a.cfg.TLS == nil {
			missing = append(missing, "--api-cert and --api-key")
		}
		if len(a.cfg.Tokens) == 0 && !a.clientCA {
			missing = append(missing, "--api-tokens or --api-client-ca")
		}
		if len(missing) > 0 {
			return a, usageError("refusing --api-addr %s: %v (set %s; or listen on loopback, e.g. %s)", a.addr, err, strings.Join(missing, "; and "), DefaultAPIAddr)
		}
		return a, usageError("refusing --api-addr %s: %v", a.addr, err)
	}
	return a, nil
}

func (a apiSettings) scheme() string {
	if a.cfg.TLS != nil {
		return "https://"
	}
	return "http://"
}

// describe says how the API is protected, for serve's stderr.
func (a apiSettings) describe() string {
	var parts []string
	if a.cfg.TLS != nil {
		parts = append(parts, "TLS")
	} else {
		parts = append(parts, "no TLS")
	}
	switch {
	case len(a.cfg.Tokens) > 0 && a.clientCA:
		parts = append(parts, "bearer tokens and client certificates")
	case len(a.cfg.Tokens) > 0:
		parts = append(parts, "bearer tokens")
	case a.clientCA:
		parts = append(parts, "client certificates")
	default:
		parts = append(parts, "no authentication")
	}
	return strings.Join(parts, ", ")
}

// runService serves the API on ln and runs the rebalancer on cn, side by
// side, until ctx ends (an interrupt: a normal end) or one of them fails,
// which stops the other. Serve's own shutdown (streams ended, calls in
// flight given their grace) is over when runService returns; the caller
// then closes srv, and the coordinator after it.
func runService(ctx context.Context, c *ucli.Context, cn *conn, srv *service.Server, ln net.Listener, printer *movePrinter, reg prometheus.Registerer) error {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var apiErr error
	wg.Go(func() {
		// Serve returns nil after a shutdown that rctx asked for.
		if apiErr = srv.Serve(rctx, ln); apiErr != nil {
			cancel(apiErr)
		}
	})
	rebErr := runRebalancer(rctx, c, cn, printer, reg)
	if rebErr != nil {
		cancel(errors.New("the rebalancer stopped"))
	}
	wg.Wait()
	if apiErr != nil {
		return failed(ctx, "serve the API", apiErr)
	}
	return rebErr
}

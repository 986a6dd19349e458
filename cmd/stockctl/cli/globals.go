package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ucli "github.com/urfave/cli/v2"
	"go.etcd.io/etcd/client/pkg/v3/transport"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/keys"
)

// Defaults of the global flags.
const (
	// DefaultDataDir is where the embedded etcd keeps its data when no
	// --endpoints are given.
	DefaultDataDir = "stockctl.etcd"
	// DefaultDialTimeout bounds connecting to etcd: an unreachable cluster
	// costs a command this long before it fails.
	DefaultDialTimeout = 5 * time.Second
	// DefaultTimeout bounds one command's work (not serve, rebalance
	// --watch, a lock's child, or the demo's sale).
	DefaultTimeout = 30 * time.Second
	// DefaultLogLevel is --log-level's default: what stockctl printed
	// before the flag existed. The rebalancer's leadership changes (info)
	// and the warnings of both libraries (a lost session, a failed move)
	// reach stderr; the debug records (sessions started, watches
	// restarted) do not.
	DefaultLogLevel = "info"
)

// Output formats of -o.
const (
	outputTable = "table"
	outputJSON  = "json"
)

func globalFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "endpoints", EnvVars: []string{"STOCKCTL_ENDPOINTS"},
			Usage: "etcd endpoints, comma-separated host:port, http://host:port or https://host:port (host:port is https with --cacert/--cert/--key); " +
				"none: an embedded etcd in --data-dir for the command's duration"},
		&ucli.GenericFlag{Name: "cluster", Value: &clusterFlag{}, // STOCKCTL_CLUSTERS: read by readGlobals
			Usage: "NAME=ep1,ep2,...: one etcd cluster of several (repeat it; the first is the fleet's registry, every process " +
				"names the same clusters in the same order; in STOCKCTL_CLUSTERS separate them with ';'); instead of --endpoints: docs/clusters.md"},
		&ucli.StringFlag{Name: "prefix", Value: coordinator.DefaultPrefix, EnvVars: []string{"STOCKCTL_PREFIX"},
			Usage: "etcd key prefix stockctl keeps everything under (a trailing / is added when missing)"},
		&ucli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: outputTable, EnvVars: []string{"STOCKCTL_OUTPUT"},
			Usage: "output format: table or json"},
		&ucli.DurationFlag{Name: "dial-timeout", Value: DefaultDialTimeout, EnvVars: []string{"STOCKCTL_DIAL_TIMEOUT"},
			Usage: "how long to try to reach etcd"},
		&ucli.DurationFlag{Name: "timeout", Value: DefaultTimeout, EnvVars: []string{"STOCKCTL_TIMEOUT"},
			Usage: "bound on the command's work; 0: none"},
		&ucli.StringFlag{Name: "cacert", EnvVars: []string{"STOCKCTL_CACERT"}, Usage: "CA bundle to verify etcd's TLS certificate with"},
		&ucli.StringFlag{Name: "cert", EnvVars: []string{"STOCKCTL_CERT"}, Usage: "client TLS certificate (with --key)"},
		&ucli.StringFlag{Name: "key", EnvVars: []string{"STOCKCTL_KEY"}, Usage: "client TLS private key (with --cert)"},
		&ucli.StringFlag{Name: "user", EnvVars: []string{envUser},
			Usage: "etcd user as name:password (the password is never printed)"},
		&ucli.StringFlag{Name: "data-dir", Value: DefaultDataDir, EnvVars: []string{"STOCKCTL_DATA_DIR"},
			Usage: "data dir of the embedded etcd (used without --endpoints)"},
		&ucli.StringFlag{Name: "log-level", Value: DefaultLogLevel, EnvVars: []string{"STOCKCTL_LOG_LEVEL"},
			Usage: "what the coordinator and the rebalancer log on stderr: " + logLevelNames},
		identityFlag(),
		&ucli.Float64Flag{Name: "space-guard", Value: coordinator.DefaultSpaceGuard, EnvVars: []string{"STOCKCTL_SPACE_GUARD"},
			Usage: "refuse new orders once etcd's database is over this share of its quota, keeping room for releases, confirms and prune (0: off; etcd 3.6 and later report the quota)"},
		&ucli.BoolFlag{Name: "eager-segments", EnvVars: []string{"STOCKCTL_EAGER_SEGMENTS"},
			Usage: "write a segment's counter with every direct order instead of selling segments lazily (coordinator.WithEagerSegments): for processes beside stockctl older than 26 November 2026, which refuse lazy counters"},
	}
}

// globals are the validated global flags.
type globals struct {
	endpoints   []string
	clusters    []clusterSpec // --cluster, in order; nil: one cluster (--endpoints or embedded)
	prefix      string
	output      string
	dialTimeout time.Duration
	timeout     time.Duration
	tls         *tls.Config // nil: plain http
	user        string
	password    string
	dataDir     string
	logLevel    slog.Level // of the coordinator's and rebalancer's loggers
	identity    string     // the coordinator's and the rebalancer's name (identity.go)
	spaceGuard  float64    // coordinator.WithSpaceGuard
	eager       bool       // coordinator.WithEagerSegments
}

// readGlobals validates the global flags. Every problem is a usage error
// (exit 2) found before anything is started or contacted.
func readGlobals(c *ucli.Context) (*globals, error) {
	g := &globals{
		prefix:      c.String("prefix"),
		output:      c.String("output"),
		dialTimeout: c.Duration("dial-timeout"),
		timeout:     c.Duration("timeout"),
		dataDir:     c.String("data-dir"),
	}
	tlsFiles := c.String("cacert") != "" || c.String("cert") != "" || c.String("key") != ""
	for _, ep := range strings.Split(c.String("endpoints"), ",") {
		if ep = strings.TrimSpace(ep); ep == "" {
			continue
		}
		norm, err := normalizeEndpoint(ep, tlsFiles)
		if err != nil {
			return nil, err
		}
		g.endpoints = append(g.endpoints, norm)
	}
	cf := globalClusters(c)
	if cf == nil || len(cf.specs) == 0 {
		// The environment only when no --cluster is given (a Generic
		// flag's EnvVars would add to the flags instead).
		cf = &clusterFlag{}
		if err := cf.Set(os.Getenv("STOCKCTL_CLUSTERS")); err != nil {
			return nil, usageError("invalid STOCKCTL_CLUSTERS: %v", err)
		}
	}
	if len(cf.specs) > 0 {
		if len(g.endpoints) > 0 {
			return nil, usageError("give --endpoints (one cluster) or --cluster (several), not both")
		}
		seen := map[string]bool{}
		for _, sp := range cf.specs {
			if seen[sp.name] {
				return nil, usageError("invalid --cluster: %q named twice", sp.name)
			}
			seen[sp.name] = true
			cs := clusterSpec{name: sp.name}
			for _, ep := range sp.endpoints {
				norm, err := normalizeEndpoint(ep, tlsFiles)
				if err != nil {
					return nil, err
				}
				cs.endpoints = append(cs.endpoints, norm)
			}
			g.clusters = append(g.clusters, cs)
		}
	}
	ks, err := keys.New(g.prefix)
	if err != nil {
		return nil, usageError("invalid --prefix %q: %v", g.prefix, err)
	}
	// "/shop" means "/shop/": every key goes there, and the connection
	// check must read there too, where a role limited to the prefix may.
	g.prefix = ks.Prefix()
	if g.output != outputTable && g.output != outputJSON {
		return nil, usageError("invalid --output %q: want table or json", g.output)
	}
	if g.dialTimeout <= 0 {
		return nil, usageError("invalid --dial-timeout %v: must be positive", g.dialTimeout)
	}
	if g.timeout < 0 {
		return nil, usageError("invalid --timeout %v: must not be negative (0: no timeout)", g.timeout)
	}
	level, err := parseLogLevel(c.String("log-level"))
	if err != nil {
		return nil, err
	}
	g.logLevel = level
	if g.identity, err = readIdentity(c); err != nil {
		return nil, err
	}
	if g.spaceGuard = c.Float64("space-guard"); !(g.spaceGuard >= 0 && g.spaceGuard <= 1) {
		return nil, usageError("invalid --space-guard %v: must be 0 (off), or more than 0 and at most 1", g.spaceGuard)
	}
	g.eager = c.Bool("eager-segments")
	if g.dataDir == "" && len(g.endpoints) == 0 && len(g.clusters) == 0 {
		return nil, usageError("--data-dir is empty: name a directory for the embedded etcd, or give --endpoints")
	}
	if u := c.String("user"); u != "" {
		name, password, ok := strings.Cut(u, ":")
		if !ok || name == "" || password == "" {
			// Never echo the value: it holds a password.
			return nil, usageError("invalid --user: want name:password")
		}
		g.user, g.password = name, password
	}
	all := slices.Clone(g.endpoints)
	for _, cs := range g.clusters {
		all = append(all, cs.endpoints...)
	}
	tc, err := tlsConfig(c.String("cacert"), c.String("cert"), c.String("key"), all)
	if err != nil {
		return nil, err
	}
	g.tls = tc
	return g, nil
}

// endpointForms names the forms --endpoints accepts, for its errors.
const endpointForms = "want host:port, http://host:port or https://host:port"

// normalizeEndpoint turns an --endpoints entry into "http://host:port" or
// "https://host:port", which is what tlsConfig and the messages that name
// endpoints expect. An entry without a scheme is read as etcdctl reads it:
// etcdctl hands it to the client as it is, and the client uses TLS for it
// exactly when it has a TLS config, which etcdctl builds from --cacert,
// --cert and --key. So here it is https:// when tlsFiles, else http://.
// Anything else (another scheme, a path, no port, user info) is a usage
// error naming the entry, without the password user info may hold.
func normalizeEndpoint(ep string, tlsFiles bool) (string, error) {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		scheme, rest = "http", ep
		if tlsFiles {
			scheme = "https"
		}
	}
	bad := func(shown, why string) error {
		return usageError("invalid --endpoints entry %q: %s; %s", shown, why, endpointForms)
	}
	if scheme = strings.ToLower(scheme); scheme != "http" && scheme != "https" {
		return "", bad(ep, fmt.Sprintf("unknown scheme %q", scheme))
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		// Checked before parsing, so that no message shows a password.
		return "", bad(ep[:len(ep)-len(rest)]+"…"+rest[at:], "user info does not belong in an endpoint (use --user)")
	}
	if hostPort, _, _ := strings.Cut(rest, "/"); strings.Count(hostPort, ":") > 1 && !strings.HasPrefix(hostPort, "[") {
		// url would call the whole address a bad port.
		return "", bad(ep, "an IPv6 address goes in brackets, as in [::1]:2379")
	}
	u, err := url.Parse(scheme + "://" + rest)
	if err != nil {
		// url's message repeats the whole URL; its last part says what is wrong.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return "", bad(ep, err.Error())
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return "", bad(ep, "an endpoint is only a host and a port, without a path or query")
	}
	host, port, err := net.SplitHostPort(u.Host)
	switch {
	case err != nil:
		return "", bad(ep, strings.TrimPrefix(err.Error(), "address "+u.Host+": "))
	case host == "":
		return "", bad(ep, "no host")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", bad(ep, fmt.Sprintf("port %q is not a number from 1 to 65535", port))
	}
	return scheme + "://" + u.Host, nil
}

// tlsConfig builds the client TLS config: from the files given, or with the
// system's roots for https endpoints given without any.
func tlsConfig(cacert, cert, key string, endpoints []string) (*tls.Config, error) {
	if (cert == "") != (key == "") {
		return nil, usageError("--cert and --key must be given together")
	}
	https := false
	for _, ep := range endpoints {
		https = https || strings.HasPrefix(ep, "https://")
	}
	if cacert == "" && cert == "" {
		if https {
			return &tls.Config{MinVersion: tls.VersionTLS12}, nil
		}
		return nil, nil
	}
	for flag, path := range map[string]string{"--cacert": cacert, "--cert": cert, "--key": key} {
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			return nil, usageError("invalid %s: %v", flag, err)
		}
	}
	info := transport.TLSInfo{TrustedCAFile: cacert, CertFile: cert, KeyFile: key}
	tc, err := info.ClientConfig()
	if err != nil {
		return nil, usageError("invalid TLS files (--cacert %q, --cert %q, --key %q): %v", cacert, cert, key, err)
	}
	return tc, nil
}

// commandContext is the ctx of a command's work: it ends on SIGINT or
// SIGTERM, and after --timeout unless that is 0. The cause names which.
func (g *globals) commandContext(c *ucli.Context) (context.Context, context.CancelFunc) {
	ctx, stop := signalContext(c)
	if g.timeout <= 0 {
		return ctx, stop
	}
	tctx, cancel := context.WithTimeoutCause(ctx, g.timeout, fmt.Errorf("gave up after --timeout %v", g.timeout))
	return tctx, func() { cancel(); stop() }
}

// envUser holds --user's name:password; lock keeps it from CMD.
const envUser = "STOCKCTL_USER"

// errInterrupted is the cause of a command's ctx after SIGINT or SIGTERM.
var errInterrupted = errors.New("interrupted")

// signalContext is a ctx that ends on SIGINT or SIGTERM (and on the extra
// signals, which then no longer end the process at once), for commands that
// run until interrupted. Its cause is errInterrupted, naming the signal.
func signalContext(c *ucli.Context, extra ...os.Signal) (context.Context, context.CancelFunc) {
	parent := c.Context
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithCancelCause(parent)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, append([]os.Signal{os.Interrupt, syscall.SIGTERM}, extra...)...)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			cancel(fmt.Errorf("%w by %v", errInterrupted, sig))
		case <-done:
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(sigs)
			close(done)
			cancel(nil)
		})
	}
}

// boundedContext bounds one step of a long-running command (connecting,
// creating a SKU) by --timeout.
func (g *globals) boundedContext(parent context.Context) (context.Context, context.CancelFunc) {
	if g.timeout <= 0 {
		return context.WithCancel(parent)
	}
	return context.WithTimeoutCause(parent, g.timeout, fmt.Errorf("gave up after --timeout %v", g.timeout))
}

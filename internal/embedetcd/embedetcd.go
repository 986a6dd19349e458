package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/client/pkg/v3/types"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// ErrDataDirInUse is returned (wrapped, with the dir named) by Start when
// another process or another Server in this process holds the data dir.
var ErrDataDirInUse = errors.New("embedetcd: data dir is in use by another process")

// Defaults applied by Start to zero Config fields.
const (
	defaultName         = "stockctl"
	defaultAddr         = "127.0.0.1:0"
	defaultReadyTimeout = 30 * time.Second
	defaultLogLevel     = "error"
)

// closeGrace is how long Close lets in-flight client requests finish before
// cutting client connections. etcd's own Close waits up to its request
// timeout (7s with default timings) for every gRPC stream to end, and watch
// and lease keep-alive streams never end by themselves, so without this any
// open watch would make Close take 7s.
const closeGrace = time.Second

// pickAttempts bounds how often Start re-picks ports it chose itself when
// another process grabbed one between our probe and etcd's bind.
const pickAttempts = 3

// Config describes one embedded etcd member.
type Config struct {
	Dir string // data directory (required); created if missing
	// Name is the member name; default "stockctl".
	Name string
	// ClientAddr is host:port for clients; default "127.0.0.1:0" (a free
	// port). Must be a loopback address unless AllowNonLoopback.
	ClientAddr string
	// PeerAddr is host:port for peers; default "127.0.0.1:0", which is only
	// allowed for a single member (empty InitialCluster).
	PeerAddr string
	// InitialCluster lists all members of a new multi-member cluster as
	// "name=http://127.0.0.1:p,..."; empty for a single member.
	InitialCluster string
	// ClusterState is "new" (default) or "existing" (joining after a
	// MemberAdd). It only matters the first time a data dir is used.
	ClusterState string
	// ReadyTimeout bounds how long Start waits for the member to serve;
	// default 30s.
	ReadyTimeout time.Duration
	// UnsafeNoFsync turns off fsync, for tests and benchmarks only: a crash
	// can lose acknowledged writes.
	UnsafeNoFsync bool
	// LogLevel is the zap level of etcd's own logs ("debug", "info", "warn",
	// "error", ...); default "error". Logs go to stderr.
	LogLevel string
	// AutoCompactionRetention turns on periodic compaction, e.g. "1h";
	// default off.
	AutoCompactionRetention string
	// QuotaBackendBytes is the backend size quota; 0 means etcd's default.
	QuotaBackendBytes int64
	// MaxTxnOps is etcd's --max-txn-ops, the most operations in one
	// transaction; 0 means etcd's default (128).
	MaxTxnOps uint
	// BcryptCost is etcd's --bcrypt-cost, the cost of the hash of a user's
	// password (auth), which every authentication pays again; 0 means
	// etcd's default (10). Tests lower it to 4: under -race on a loaded
	// machine one authentication at 10 took long enough for a CLI run's
	// 20-second dial to expire (TestTLSAndAuth).
	BcryptCost uint
	// AllowNonLoopback permits ClientAddr, PeerAddr and InitialCluster to
	// name non-loopback addresses. Off by default so that a typo cannot expose
	// an unauthenticated etcd to the network. The addresses are advertised
	// as given, so name a reachable address rather than 0.0.0.0.
	AllowNonLoopback bool

	// CertFile and KeyFile, when set (both or neither), make the member
	// serve clients over TLS (https) with this certificate; the certificate
	// must be valid for the client address (e.g. an IP SAN of 127.0.0.1).
	// Peer traffic stays plain.
	CertFile, KeyFile string
	// TrustedCAFile is the CA bundle client certificates are checked
	// against; it needs CertFile.
	TrustedCAFile string
	// ClientCertAuth makes the member require a client certificate signed
	// by TrustedCAFile (which it needs).
	ClientCertAuth bool

	// GRPCServerOptions are added to the member's client gRPC servers: for
	// tests that inject faults into real server traffic (an interceptor
	// answering as another etcd version would).
	GRPCServerOptions []grpc.ServerOption
}

// Server is a running embedded etcd member.
type Server struct {
	e         *embed.Etcd
	grpcs     *grpcServers
	closing   *atomic.Bool // set before any deliberate e.Close; see newLogger
	lock      *os.File
	endpoints []string
	closeOnce sync.Once
}

// Start starts an etcd member as described by cfg and waits until it serves
// clients. ctx only bounds the startup; the server keeps running after ctx
// is done, until Close.
//
// Start fails fast with an error wrapping ErrDataDirInUse if the data dir is
// held by someone else. On any failure nothing is left running and the data
// dir is unlocked.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	closing := new(atomic.Bool)
	// Built first so that a bad LogLevel fails without touching the data dir.
	lg, err := newLogger(cfg.LogLevel, closing)
	if err != nil {
		return nil, err
	}
	// 0700 because the data dir holds the whole database and etcd warns about
	// anything laxer.
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedetcd: create data dir %s: %w", cfg.Dir, err)
	}
	lock, err := lockDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	grpcs := new(grpcServers)
	e, err := startEtcd(cfg, lg, grpcs)
	if err != nil {
		unlockDir(lock)
		return nil, err
	}
	s := &Server{
		e:         e,
		grpcs:     grpcs,
		closing:   closing,
		lock:      lock,
		endpoints: []string{cfg.clientScheme() + "://" + e.Clients[0].Addr().String()},
	}
	if err := waitReady(ctx, e, cfg); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Endpoints returns the client URLs of the member, with the real port even
// when ":0" was asked for.
func (s *Server) Endpoints() []string {
	return append([]string(nil), s.endpoints...)
}

// Etcd returns the underlying embed.Etcd, for tests that need to look at raft
// state such as the leader.
func (s *Server) Etcd() *embed.Etcd {
	return s.e
}

// Close stops etcd and then releases the data dir lock. Requests in flight
// get up to a second to finish; open watch and lease keep-alive streams are
// then cut, and their clients reconnect elsewhere or once the member is back.
// Close is idempotent and safe to call concurrently; every call returns only
// once etcd has stopped.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.closing.Store(true) // etcd's shutdown noise is expected from here on
		s.grpcs.stop(closeGrace)
		s.e.Close()
		// embed.Etcd.Close returns only after the WAL and bbolt are closed,
		// so unlocking now cannot let a successor open them while we still
		// hold them.
		unlockDir(s.lock)
	})
}

func (cfg *Config) setDefaults() {
	if cfg.Name == "" {
		cfg.Name = defaultName
	}
	if cfg.ClientAddr == "" {
		cfg.ClientAddr = defaultAddr
	}
	if cfg.PeerAddr == "" {
		cfg.PeerAddr = defaultAddr
	}
	if cfg.ClusterState == "" {
		cfg.ClusterState = embed.ClusterStateFlagNew
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = defaultReadyTimeout
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = defaultLogLevel
	}
}

func (cfg *Config) validate() error {
	if cfg.Dir == "" {
		return errors.New("embedetcd: Config.Dir is required")
	}
	if cfg.ClusterState != embed.ClusterStateFlagNew && cfg.ClusterState != embed.ClusterStateFlagExisting {
		return fmt.Errorf("embedetcd: ClusterState %q: want %q or %q", cfg.ClusterState, embed.ClusterStateFlagNew, embed.ClusterStateFlagExisting)
	}
	switch {
	case (cfg.CertFile == "") != (cfg.KeyFile == ""):
		return errors.New("embedetcd: CertFile and KeyFile must be set together")
	case cfg.TrustedCAFile != "" && cfg.CertFile == "":
		return errors.New("embedetcd: TrustedCAFile needs CertFile and KeyFile (client TLS)")
	case cfg.ClientCertAuth && cfg.TrustedCAFile == "":
		return errors.New("embedetcd: ClientCertAuth needs TrustedCAFile")
	}
	if cfg.ReadyTimeout < 0 {
		return fmt.Errorf("embedetcd: ReadyTimeout %v is negative", cfg.ReadyTimeout)
	}
	for _, a := range []struct{ field, addr string }{{"ClientAddr", cfg.ClientAddr}, {"PeerAddr", cfg.PeerAddr}} {
		if err := checkAddr(a.addr, cfg.AllowNonLoopback); err != nil {
			return fmt.Errorf("embedetcd: %s: %w", a.field, err)
		}
	}
	if cfg.InitialCluster != "" {
		if isPortZero(cfg.PeerAddr) {
			// Every member must know every other member's peer URL before any
			// of them starts, so a port picked at start time cannot work.
			return fmt.Errorf("embedetcd: PeerAddr %q: a multi-member cluster (InitialCluster set) needs an explicit peer port", cfg.PeerAddr)
		}
		m, err := types.NewURLsMap(cfg.InitialCluster)
		if err != nil {
			return fmt.Errorf("embedetcd: InitialCluster %q: %w", cfg.InitialCluster, err)
		}
		if _, ok := m[cfg.Name]; !ok {
			return fmt.Errorf("embedetcd: InitialCluster %q has no member named %q", cfg.InitialCluster, cfg.Name)
		}
		for name, urls := range m {
			for _, u := range urls {
				if err := checkAddr(u.Host, cfg.AllowNonLoopback); err != nil {
					return fmt.Errorf("embedetcd: InitialCluster member %s: %w", name, err)
				}
			}
		}
	}
	return nil
}

// checkAddr accepts host:port with a numeric port, and unless allowNonLoopback
// only loopback IPs or "localhost" as host. An empty host means "all
// interfaces" and so is not loopback.
func checkAddr(addr string, allowNonLoopback bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("address %q: bad port %q", addr, port)
	}
	if allowNonLoopback || host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("address %q is not a loopback address (set AllowNonLoopback to allow it)", addr)
	}
	return nil
}

// clientScheme is "https" when the member serves clients over TLS.
func (cfg *Config) clientScheme() string {
	if cfg.CertFile != "" {
		return "https"
	}
	return "http"
}

func isPortZero(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && port == "0"
}

// pickPort replaces a ":0" port with a currently free one. etcd advertises its
// URLs to the cluster and to clients (MemberList, endpoint auto-sync) before
// it knows which port a ":0" listener got, so we probe for a port up front and
// let etcd bind it. Another process can take it in between; startEtcd retries
// with a new pick when that happens.
func pickPort(addr string) (resolved string, picked bool, err error) {
	if !isPortZero(addr) {
		return addr, false, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", false, fmt.Errorf("embedetcd: find free port on %s: %w", addr, err)
	}
	resolved = l.Addr().String()
	if err := l.Close(); err != nil {
		return "", false, fmt.Errorf("embedetcd: release probe port %s: %w", resolved, err)
	}
	return resolved, true, nil
}

func startEtcd(cfg Config, lg *zap.Logger, grpcs *grpcServers) (*embed.Etcd, error) {
	for attempt := 1; ; attempt++ {
		clientAddr, pickedClient, err := pickPort(cfg.ClientAddr)
		if err != nil {
			return nil, err
		}
		peerAddr, pickedPeer, err := pickPort(cfg.PeerAddr)
		if err != nil {
			return nil, err
		}
		e, err := embed.StartEtcd(embedConfig(cfg, clientAddr, peerAddr, lg, grpcs))
		if err == nil {
			return e, nil
		}
		// Listeners are bound before etcd touches the data dir, so after a
		// bind failure a retry starts from a clean slate.
		if (pickedClient || pickedPeer) && errors.Is(err, syscall.EADDRINUSE) && attempt < pickAttempts {
			continue
		}
		return nil, fmt.Errorf("embedetcd: start etcd member %q in %s (client %s, peer %s): %w", cfg.Name, cfg.Dir, clientAddr, peerAddr, err)
	}
}

func embedConfig(cfg Config, clientAddr, peerAddr string, lg *zap.Logger, grpcs *grpcServers) *embed.Config {
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.Dir
	clientURL := url.URL{Scheme: cfg.clientScheme(), Host: clientAddr}
	peerURL := url.URL{Scheme: "http", Host: peerAddr}
	ec.ListenClientUrls = []url.URL{clientURL}
	ec.AdvertiseClientUrls = []url.URL{clientURL}
	ec.ListenPeerUrls = []url.URL{peerURL}
	ec.AdvertisePeerUrls = []url.URL{peerURL}
	if cfg.InitialCluster != "" {
		ec.InitialCluster = cfg.InitialCluster
	} else {
		ec.InitialCluster = ec.InitialClusterFromName(cfg.Name)
	}
	ec.ClusterState = cfg.ClusterState
	if cfg.CertFile != "" {
		ec.ClientTLSInfo = transport.TLSInfo{
			CertFile:       cfg.CertFile,
			KeyFile:        cfg.KeyFile,
			TrustedCAFile:  cfg.TrustedCAFile,
			ClientCertAuth: cfg.ClientCertAuth,
		}
	}
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	ec.GRPCAdditionalServerOptions = cfg.GRPCServerOptions
	if cfg.AutoCompactionRetention != "" {
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = cfg.AutoCompactionRetention
	}
	ec.QuotaBackendBytes = cfg.QuotaBackendBytes
	if cfg.MaxTxnOps > 0 {
		ec.MaxTxnOps = cfg.MaxTxnOps
	}
	if cfg.BcryptCost > 0 {
		ec.BcryptCost = cfg.BcryptCost
	}
	// stderr only, so no log files anywhere. LogLevel and LogOutputs only
	// describe lg to etcd; lg itself decides what is written.
	ec.Logger = "zap"
	ec.LogLevel = cfg.LogLevel
	ec.LogOutputs = []string{embed.StdErrLogOutput}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	// Used not to register services but because it is the only way embed
	// hands out its client gRPC servers, which Close needs (see closeGrace).
	ec.ServiceRegister = grpcs.add
	return ec
}

// waitReady waits until e serves clients, and returns early with an error if
// etcd fails or stops, ctx is done, or the ready timeout passes. The caller
// closes e on error.
func waitReady(ctx context.Context, e *embed.Etcd, cfg Config) error {
	timer := time.NewTimer(cfg.ReadyTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		// Err is closed (nil) once all serving goroutines are gone; a nil
		// error is still a failure because nothing is serving any more.
		if err == nil {
			err = errors.New("serving stopped")
		}
		return fmt.Errorf("embedetcd: etcd member %q in %s failed before it was ready: %w", cfg.Name, cfg.Dir, err)
	case <-e.Server.StopNotify():
		return fmt.Errorf("embedetcd: etcd member %q in %s stopped before it was ready", cfg.Name, cfg.Dir)
	case <-timer.C:
		return fmt.Errorf("embedetcd: etcd member %q in %s not ready after %v (a multi-member cluster needs a quorum of members running)", cfg.Name, cfg.Dir, cfg.ReadyTimeout)
	case <-ctx.Done():
		return fmt.Errorf("embedetcd: waiting for etcd member %q in %s to be ready: %w", cfg.Name, cfg.Dir, ctx.Err())
	}
}

package service

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockctl/stockctl/coordinator"
)

// Defaults. Each is what the matching Config field gets when left zero.
const (
	// DefaultMaxInflight bounds the short calls (every unary call but
	// LockService.Acquire) running at once. Beyond it a call is refused at
	// once with RESOURCE_EXHAUSTED: it costs a parsed header and a small
	// answer, never a goroutine left waiting. Cost of a higher bound: more
	// memory under a storm (each call holds its request, at most
	// MaxBodyBytes) and more goroutines queueing inside the coordinator.
	DefaultMaxInflight = 512

	// DefaultMaxStreams bounds the long calls at once: WatchStatus,
	// WatchOrders and Hold streams, lock acquisitions (LockService.Acquire
	// waits for the lock), and reflection streams. Each open stream costs a
	// goroutine or two and an etcd watch (WatchStatus; WatchOrders has one of
	// its own gRPC stream to etcd, and holds a snapshot page, of
	// SnapshotPagesInFlight over all streams, while it sends it).
	DefaultMaxStreams = 1024

	// DefaultMaxHolds bounds the unary lock holds (Acquire) a server keeps
	// at once, live ones; each costs a goroutine and a timer.
	DefaultMaxHolds = 10000

	// DefaultMaxBodyBytes bounds a request message (after decompression).
	// stockctl's largest legitimate request is well under 4 KiB.
	DefaultMaxBodyBytes = 64 << 10

	// DefaultEtcdWait is how long a call waits for the coordinator's etcd
	// connection to be ready before it fails with UNAVAILABLE
	// (ETCD_UNAVAILABLE). It is also never more than half of the call's own
	// deadline, so that the client hears UNAVAILABLE rather than its own
	// timeout. Cost: a blip of etcd shorter than this is hidden from
	// callers; a longer outage costs each call this long.
	DefaultEtcdWait = 2 * time.Second

	// DefaultShutdownGrace is how long Serve lets calls in flight finish
	// after its ctx ends; streams are ended at once.
	DefaultShutdownGrace = 10 * time.Second

	// DefaultLockTTL is a hold's ttl when the caller gives none: how long a
	// lock stays held after the caller's last sign of life (a KeepAlive, or
	// any message on a Hold stream). Cost: a caller that dies holding a lock
	// keeps others waiting this long.
	DefaultLockTTL = 15 * time.Second
	// MinLockTTL and MaxLockTTL bound a hold's ttl.
	MinLockTTL = time.Second
	MaxLockTTL = 5 * time.Minute

	// DefaultHoldRetention is how long a unary hold that ended is
	// remembered, so that a late KeepAlive or Release learns why it ended
	// (LOCK_LOST with its reason, or the released answer again) rather than
	// HOLD_NOT_FOUND.
	DefaultHoldRetention = time.Minute

	// DefaultWatchInterval is WatchStatus's least time between frames when
	// the request gives none; MinWatchInterval and MaxWatchInterval bound it.
	DefaultWatchInterval = 100 * time.Millisecond
	MinWatchInterval     = 10 * time.Millisecond
	MaxWatchInterval     = time.Minute

	// DefaultBodyTimeout is how long a call's request body (of a unary
	// call or a server stream) may take to arrive. It is read whole before
	// the call takes a slot of MaxInflight or MaxStreams, so that a caller
	// that sends its body slowly holds no slot; past this the call is
	// refused (DEADLINE_EXCEEDED) and an HTTP/1.1 connection closed.
	DefaultBodyTimeout = 5 * time.Second

	// DefaultSnapshotPageTimeout is how long a WatchOrders snapshot page
	// may wait for its caller to take it (HTTP/2 flow control): past it the
	// stream is ended, and the page's memory and its slot of
	// SnapshotPagesInFlight freed for other streams.
	DefaultSnapshotPageTimeout = 10 * time.Second

	// DefaultMaxBodiesPerConn bounds the request bodies one connection
	// may be sending at once (HTTP/2 multiplexes calls on a connection).
	DefaultMaxBodiesPerConn = 32

	// MinTokenLen is the shortest bearer token accepted in Config.Tokens:
	// 16 bytes, e.g. 32 hex digits of a random 128-bit value is plenty.
	MinTokenLen = 16
)

// Config configures a Server. The zero value serves without TLS or
// authentication, fit for loopback only (see CheckListen), with the
// defaults above.
type Config struct {
	// Tokens are the bearer tokens accepted. Empty: no token is needed.
	// Each is at least MinTokenLen bytes of printable ASCII without spaces.
	Tokens []string
	// TLS, when set, makes Serve speak TLS with it (HTTP/2 and HTTP/1.1 by
	// ALPN). For client certificates (mTLS) set ClientAuth to
	// tls.RequireAndVerifyClientCert and ClientCAs. LoadTLS builds one from
	// PEM files. Nil: cleartext, HTTP/1.1 and HTTP/2 without TLS (h2c).
	TLS *tls.Config
	// MaxInflight: see DefaultMaxInflight.
	MaxInflight int
	// MaxStreams: see DefaultMaxStreams.
	MaxStreams int
	// MaxHolds: see DefaultMaxHolds.
	MaxHolds int
	// MaxBodyBytes: see DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// EtcdWait: see DefaultEtcdWait.
	EtcdWait time.Duration
	// ShutdownGrace: see DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// HoldRetention: see DefaultHoldRetention.
	HoldRetention time.Duration
	// BodyTimeout: see DefaultBodyTimeout.
	BodyTimeout time.Duration
	// SnapshotPageTimeout: see DefaultSnapshotPageTimeout.
	SnapshotPageTimeout time.Duration
	// MaxBodiesPerConn: see DefaultMaxBodiesPerConn.
	MaxBodiesPerConn int
	// MaxInflightPerToken bounds the short calls of one token in flight,
	// and the bodies of one token's calls being read: a caller with its
	// own token cannot take every slot. Default: MaxInflight/2 with more
	// than one token, else no bound of its own (MaxInflight).
	MaxInflightPerToken int
	// Registerer, if set, receives the service's metrics (see the package
	// documentation); Close unregisters them.
	Registerer prometheus.Registerer
	// Logger receives failed calls that are the server's fault (INTERNAL,
	// DATA_LOSS, UNAVAILABLE), lost holds and shutdown; default: discarded.
	// Tokens and request bodies are never logged.
	Logger *slog.Logger
	// Console, when true, serves the live sale console (package console)
	// under /console/ beside the API, on the same listener and so with the
	// same TLS and client certificates. Its files need no token; every API
	// call the page makes sends the token the user enters.
	Console bool
}

// withDefaults validates cfg and fills in its zero fields. Errors wrap
// coordinator.ErrInvalidArgument and name the field.
func (cfg Config) withDefaults() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("service: %w: %s", coordinator.ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	for i, t := range cfg.Tokens {
		if err := validateToken(t); err != nil {
			return bad("token %d: %v", i+1, err) // never the token itself
		}
	}
	switch {
	case cfg.MaxInflight < 0:
		return bad("MaxInflight %d: must not be negative", cfg.MaxInflight)
	case cfg.MaxStreams < 0:
		return bad("MaxStreams %d: must not be negative", cfg.MaxStreams)
	case cfg.MaxHolds < 0:
		return bad("MaxHolds %d: must not be negative", cfg.MaxHolds)
	case cfg.MaxBodyBytes < 0:
		return bad("MaxBodyBytes %d: must not be negative", cfg.MaxBodyBytes)
	case cfg.EtcdWait < 0 || cfg.ShutdownGrace < 0 || cfg.HoldRetention < 0 || cfg.BodyTimeout < 0 || cfg.SnapshotPageTimeout < 0:
		return bad("EtcdWait, ShutdownGrace, HoldRetention, BodyTimeout and SnapshotPageTimeout must not be negative")
	case cfg.MaxBodiesPerConn < 0 || cfg.MaxInflightPerToken < 0:
		return bad("MaxBodiesPerConn and MaxInflightPerToken must not be negative")
	case cfg.TLS != nil && len(cfg.TLS.Certificates) == 0 && cfg.TLS.GetCertificate == nil && cfg.TLS.GetConfigForClient == nil:
		return bad("TLS has no certificate")
	}
	cfg.MaxInflight = orDefault(cfg.MaxInflight, DefaultMaxInflight)
	cfg.MaxStreams = orDefault(cfg.MaxStreams, DefaultMaxStreams)
	cfg.MaxHolds = orDefault(cfg.MaxHolds, DefaultMaxHolds)
	cfg.MaxBodyBytes = orDefault(cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	cfg.EtcdWait = orDefault(cfg.EtcdWait, DefaultEtcdWait)
	cfg.ShutdownGrace = orDefault(cfg.ShutdownGrace, DefaultShutdownGrace)
	cfg.HoldRetention = orDefault(cfg.HoldRetention, DefaultHoldRetention)
	cfg.BodyTimeout = orDefault(cfg.BodyTimeout, DefaultBodyTimeout)
	cfg.SnapshotPageTimeout = orDefault(cfg.SnapshotPageTimeout, DefaultSnapshotPageTimeout)
	cfg.MaxBodiesPerConn = orDefault(cfg.MaxBodiesPerConn, DefaultMaxBodiesPerConn)
	perToken := cfg.MaxInflight
	if len(cfg.Tokens) > 1 {
		perToken = max(1, cfg.MaxInflight/2)
	}
	cfg.MaxInflightPerToken = orDefault(cfg.MaxInflightPerToken, perToken)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

func validateToken(t string) error {
	if len(t) < MinTokenLen {
		return fmt.Errorf("is %d bytes, shorter than %d", len(t), MinTokenLen)
	}
	for i := 0; i < len(t); i++ {
		if c := t[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("byte %d is not printable ASCII other than space", i)
		}
	}
	return nil
}

// clientAuth says how cfg authenticates clients, "" when it does not.
func (cfg Config) clientAuth() string {
	var ways []string
	if len(cfg.Tokens) > 0 {
		ways = append(ways, "bearer tokens")
	}
	if cfg.TLS != nil && cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert && cfg.TLS.ClientCAs != nil {
		ways = append(ways, "client certificates")
	}
	return strings.Join(ways, " and ")
}

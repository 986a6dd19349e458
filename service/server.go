package service

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/reflect/protoreflect"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/console"
	"github.com/stockctl/stockctl/coordinator"
)

// Server serves stockctl's network API for one coordinator. Create it with
// New, serve it with Serve (or mount Handler in a server of your own), and
// Close it when done. It is safe for concurrent use.
type Server struct {
	c       *coordinator.Coordinator
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	handler http.Handler
	holds   *holdTable
	counts  *orderCounts // Allocate and Reserve answers per SKU, for InspectService

	closing chan struct{} // closed when shutdown begins: streams end, health says NOT_SERVING
	// snapshotPages holds a slot per WatchOrders snapshot page in memory.
	snapshotPages chan struct{}
	closeOnce     sync.Once
	bg            sync.WaitGroup // goroutines keeping unary holds

	// Test hooks (export_test.go), nil in use: afterGrant runs in Acquire
	// when the lock came, beforeAnswer when the hold is registered and its
	// answer about to be sent.
	afterGrant, beforeAnswer func(ctx context.Context)
}

// New returns a server for c with cfg (zero fields get the defaults). It
// validates cfg and registers the metrics with cfg.Registerer; errors wrap
// coordinator.ErrInvalidArgument or the registration's error. The
// coordinator stays the caller's: Close the server before it.
func New(c *coordinator.Coordinator, cfg Config) (*Server, error) {
	if c == nil {
		return nil, fmt.Errorf("service: coordinator is nil: %w", coordinator.ErrInvalidArgument)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{
		c:       c,
		cfg:     cfg,
		log:     cfg.Logger,
		metrics: newMetrics(),
		closing: make(chan struct{}),
		counts:  newOrderCounts(),

		snapshotPages: make(chan struct{}, SnapshotPagesInFlight),
	}
	s.holds = newHoldTable(s)
	if cfg.Registerer != nil {
		if err := s.metrics.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("service: register metrics: %w", err)
		}
	}
	s.handler = s.newFront(s.newMux())
	if cfg.Console {
		s.handler = withConsole(s.handler)
	}
	return s, nil
}

// withConsole serves the console's files under console.Path (and its
// path without the slash) and everything else with api.
func withConsole(api http.Handler) http.Handler {
	files := console.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Path; p == strings.TrimSuffix(console.Path, "/") || strings.HasPrefix(p, console.Path) {
			files.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}

// compressMinBytes is the least size of an answer that is compressed for
// a client that accepts it: 16 KiB. At 1 KiB (until 27 November) an
// OrderStream message of a dozen answers was compressed, and gzip (its
// writer's reset and deflate) was 5 % of a serve process's CPU in a
// profile of a sale through the API, to save a few hundred bytes on a
// datacenter network.
const compressMinBytes = 16 << 10

// newMux mounts the Connect handlers: both services, reflection and health.
func (s *Server) newMux() http.Handler {
	opts := []connect.HandlerOption{
		connect.WithInterceptors(interceptor{}, countingInterceptor{s.counts}),
		connect.WithReadMaxBytes(int(s.cfg.MaxBodyBytes)),
		connect.WithRecover(s.recovered),
		connect.WithCodec(jsonCodec{name: "json"}),
		connect.WithCodec(jsonCodec{name: "json; charset=utf-8"}),
		// Connect compresses every answer to a client that accepts gzip
		// (gRPC clients say they do), and a gzip writer's reset alone cost
		// a fifth of a server's CPU on answers of a hundred bytes, which
		// compression cannot shrink anyway. Only large answers (a Status
		// of hundreds of segments, a page of the feed) are worth it.
		connect.WithCompressMinBytes(compressMinBytes),
	}
	mux := http.NewServeMux()
	mux.Handle(stockctlv1connect.NewStockServiceHandler(stockService{s}, opts...))
	mux.Handle(stockctlv1connect.NewLockServiceHandler(lockService{s}, opts...))
	mux.Handle(stockctlv1connect.NewInspectServiceHandler(inspectService{s}, opts...))
	reflector := grpcreflect.NewStaticReflector(stockctlv1connect.StockServiceName, stockctlv1connect.LockServiceName,
		stockctlv1connect.InspectServiceName, grpchealth.HealthV1ServiceName)
	mux.Handle(grpcreflect.NewHandlerV1(reflector, opts...))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, opts...))
	mux.Handle(grpchealth.NewHandler(healthChecker{s}, opts...))
	return mux
}

// newFront puts the middleware in front of next, with the table of the
// procedures it serves.
func (s *Server) newFront(next http.Handler) *front {
	f := &front{
		s:     s,
		next:  next,
		errw:  connect.NewErrorWriter(),
		procs: map[string]procInfo{},
		short: make(chan struct{}, s.cfg.MaxInflight),
		long:  make(chan struct{}, s.cfg.MaxStreams),

		reading:  make(chan struct{}, s.cfg.MaxInflight+s.cfg.MaxStreams),
		perToken: make([]atomic.Int64, len(s.cfg.Tokens)),
		perConn:  map[string]int{},
	}
	for _, t := range s.cfg.Tokens {
		f.tokens = append(f.tokens, sha256.Sum256([]byte(t)))
	}
	for _, fd := range []protoreflect.FileDescriptor{stockctlv1.File_stockctl_v1_stock_service_proto, stockctlv1.File_stockctl_v1_lock_service_proto, stockctlv1.File_stockctl_v1_inspect_service_proto} {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				md := sd.Methods().Get(j)
				path := "/" + string(sd.FullName()) + "/" + string(md.Name())
				// Acquire waits for the lock as long as its caller allows.
				long := md.IsStreamingClient() || md.IsStreamingServer() || path == stockctlv1connect.LockServiceAcquireProcedure
				f.procs[path] = procInfo{long: long, readBody: !md.IsStreamingClient()}
			}
		}
	}
	f.procs["/grpc.health.v1.Health/Check"] = procInfo{health: true}
	f.procs["/grpc.health.v1.Health/Watch"] = procInfo{health: true}
	f.procs["/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"] = procInfo{long: true}
	f.procs["/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"] = procInfo{long: true}
	return f
}

func (s *Server) recovered(_ context.Context, spec connect.Spec, _ http.Header, p any) error {
	s.log.Error("api: handler panicked", "method", methodLabel(spec.Procedure), "panic", p)
	return newError(connect.CodeInternal, stockctlv1.ErrorReason_ERROR_REASON_INTERNAL, errors.New("internal error"), nil)
}

// Handler is the API as one http.Handler: gRPC, gRPC-Web and Connect on the
// paths /stockctl.v1.StockService/*, /stockctl.v1.LockService/*, reflection
// and health, behind authentication, load shedding and metrics. gRPC needs
// HTTP/2: mounted in a server of your own without TLS, enable unencrypted
// HTTP/2 (http.Protocols.SetUnencryptedHTTP2).
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves the API on ln until ctx ends, then shuts down: health turns
// NOT_SERVING, streams end (Hold streams release their locks and say so),
// and calls in flight get Config.ShutdownGrace to finish. With Config.TLS
// it speaks TLS (HTTP/2 and HTTP/1.1 by ALPN), else HTTP/1.1 and HTTP/2
// without TLS (h2c, so that gRPC works on loopback). It refuses a listener
// that CheckListen refuses. It returns nil after a shutdown that ctx asked
// for, or the listener's error. A Server serves once: Close it after.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if err := CheckListen(ln.Addr().String(), s.cfg); err != nil {
		return err
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: 256},
		Protocols:         &protocols,
	}
	serve := func() error { return hs.Serve(ln) }
	if s.cfg.TLS != nil {
		protocols.SetHTTP2(true)
		hs.TLSConfig = s.cfg.TLS.Clone()
		serve = func() error { return hs.ServeTLS(ln, "", "") }
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	errc := make(chan error, 1)
	go func() { errc <- serve() }()
	select {
	case err := <-errc:
		s.shutdown()
		return fmt.Errorf("service: serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	s.shutdown()
	s.log.Info("api: shutting down", "addr", ln.Addr().String(), "grace", s.cfg.ShutdownGrace)
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownGrace)
	defer cancel()
	err := hs.Shutdown(sctx)
	if err != nil {
		err = fmt.Errorf("service: calls still running after %v were cut off: %w", s.cfg.ShutdownGrace, err)
		_ = hs.Close()
	}
	<-errc // http.ErrServerClosed
	return err
}

// shutdown starts the end: streams end and health says NOT_SERVING.
func (s *Server) shutdown() {
	s.closeOnce.Do(func() { close(s.closing) })
}

func (s *Server) isClosing() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// Close shuts the server down: it ends streams, releases every lock held
// for remote callers (each release bounded by coordinator.DefaultReleaseTimeout)
// and unregisters the metrics. It does not close the coordinator or stop a
// running Serve (cancel its ctx). Close is idempotent.
func (s *Server) Close() error {
	s.shutdown()
	s.holds.closeAll()
	s.bg.Wait()
	if s.cfg.Registerer != nil {
		s.metrics.unregister(s.cfg.Registerer)
	}
	return nil
}

// fail maps err to the client's error and logs those that are the
// server's business.
func (s *Server) fail(ctx context.Context, o op, method string, err error) *connect.Error {
	ce := apiError(ctx, o, err)
	switch ce.Code() {
	case connect.CodeInternal, connect.CodeDataLoss, connect.CodeUnavailable, connect.CodeUnknown:
		s.log.Warn("api: call failed", "method", method, "code", ce.Code().String(), "err", err)
	}
	return ce
}

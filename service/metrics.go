package service

import (
	"context"
	"errors"
	"google.golang.org/protobuf/proto"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the service's Prometheus metrics (see the package doc). They
// are always kept, a few atomic adds per call, and exported only when
// Config.Registerer is set.
type metrics struct {
	duration *prometheus.HistogramVec // method, code
	rejected *prometheus.CounterVec   // reason
	inflight *prometheus.GaugeVec     // kind: short, long
	holds    *prometheus.GaugeVec     // shape: stream, lease
}

// Rejection reasons of stockctl_api_rejected_total.
const (
	rejectOverloaded   = "overloaded"
	rejectBodyTooLarge = "body_too_large"
	rejectBodyTimeout  = "body_timeout"
	rejectTokenMissing = "token_missing"
	rejectTokenInvalid = "token_invalid"
	rejectTokenInURL   = "token_in_url"
)

// unknownMethod is the method label of a path that names no procedure the
// server serves: paths are caller-chosen, so they never become labels.
const unknownMethod = "unknown"

func newMetrics() *metrics {
	m := &metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "stockctl_api_request_duration_seconds",
			Help: "Calls of the network API by method and gRPC code, from the first byte to the last (a stream's whole life).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60,
				300},
		}, []string{"method", "code"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockctl_api_rejected_total",
			Help: "Calls refused before a handler ran, by reason: overloaded, body_too_large, body_timeout, token_missing, token_invalid, token_in_url.",
		}, []string{"reason"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stockctl_api_inflight_calls",
			Help: "Calls running now; kind short (bounded by MaxInflight) or long (streams and lock acquisitions, bounded by MaxStreams).",
		}, []string{"kind"}),
		holds: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stockctl_api_lock_holds",
			Help: "Locks held for remote callers now; shape stream (LockService.Hold) or lease (Acquire/KeepAlive/Release).",
		}, []string{"shape"}),
	}
	// Series that exist from the start, so that dashboards and alerts see
	// zeros instead of nothing.
	for _, r := range []string{rejectOverloaded, rejectBodyTooLarge, rejectTokenMissing, rejectTokenInvalid, rejectTokenInURL} {
		m.rejected.WithLabelValues(r)
	}
	for _, k := range []string{kindShort, kindLong} {
		m.inflight.WithLabelValues(k)
	}
	for _, s := range []string{shapeStream, shapeLease} {
		m.holds.WithLabelValues(s)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.duration, m.rejected, m.inflight, m.holds}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	var done []prometheus.Collector
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return err
		}
		done = append(done, c)
	}
	return nil
}

func (m *metrics) unregister(reg prometheus.Registerer) {
	for _, c := range m.collectors() {
		reg.Unregister(c)
	}
}

// observe records one call.
func (m *metrics) observe(method string, code string, d time.Duration) {
	m.duration.WithLabelValues(method, code).Observe(d.Seconds())
}

// codeLabel is the code label of a call's outcome.
func codeLabel(err error) string {
	if err == nil {
		return "ok"
	}
	if errors.Is(err, context.Canceled) {
		return connect.CodeCanceled.String()
	}
	return connect.CodeOf(err).String()
}

// methodLabel is the method label of a procedure ("/pkg.Service/Method").
func methodLabel(procedure string) string {
	return strings.TrimPrefix(procedure, "/")
}

// callRecord is what the middleware learns about one call: its code, set
// by the interceptor when a handler ran, or by the middleware when it
// refused the call.
type callRecord struct {
	code string
	// abandon, set by an Acquire that granted a hold, releases it: the
	// middleware calls it when the caller went away before the answer
	// was sent.
	abandon func()
	// rc controls the call's response (write deadlines of streams).
	rc *http.ResponseController
}

type recordKey struct{}

func withRecord(ctx context.Context, rec *callRecord) context.Context {
	return context.WithValue(ctx, recordKey{}, rec)
}

func recordOf(ctx context.Context) *callRecord {
	rec, _ := ctx.Value(recordKey{}).(*callRecord)
	return rec
}

// interceptor tells the middleware the outcome of every call that reached
// a handler. Calls that did not (refused by the middleware, or whose
// request did not decode) are labelled from the response instead.
type interceptor struct{}

func (interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		var res connect.AnyResponse
		err := error(nil)
		if m, ok := req.Any().(proto.Message); ok {
			if cerr := checkASCII(m); cerr != nil {
				err = apiError(ctx, opRead, cerr)
			}
		}
		if err == nil {
			res, err = next(ctx, req)
		}
		if rec := recordOf(ctx); rec != nil {
			rec.code = codeLabel(err)
		}
		return res, err
	}
}

func (interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		err := next(ctx, conn)
		if rec := recordOf(ctx); rec != nil {
			rec.code = codeLabel(err)
		}
		return err
	}
}

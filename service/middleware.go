package service

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
)

// Kinds of call, each with its own bound (and inflight gauge).
const (
	kindShort = "short" // unary calls: bounded by MaxInflight
	kindLong  = "long"  // streams and lock acquisitions: bounded by MaxStreams
)

// procInfo is what the middleware knows of a procedure before any handler
// runs.
type procInfo struct {
	long   bool // may last as long as the caller wants: the long bound
	health bool // grpc.health.v1: no token, no shedding (load balancers)
}

// envelopeBytes is the framing around a message in gRPC and Connect
// streaming bodies.
const envelopeBytes = 5

// front is the HTTP middleware in front of the Connect handlers. In order,
// it refuses credentials in the URL, unauthenticated calls, bodies
// announced larger than the limit, and calls beyond the in-flight bounds,
// each at once and in the caller's protocol; and it records every call's
// code and latency.
type front struct {
	s      *Server
	next   http.Handler
	errw   *connect.ErrorWriter
	procs  map[string]procInfo
	tokens [][sha256.Size]byte // digests: compared in constant time
	short  chan struct{}       // a slot per short call in flight
	long   chan struct{}       // a slot per long call in flight
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	info, known := f.procs[r.URL.Path]
	method := unknownMethod
	if known {
		method = methodLabel(r.URL.Path)
	}
	rec := &callRecord{}
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		code := rec.code
		if code == "" {
			code = sw.code()
		}
		f.s.metrics.observe(method, code, time.Since(start))
	}()

	if f.credentialInURL(r) {
		f.refuse(sw, r, rec, rejectTokenInURL, newError(connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_TOKEN_IN_URL,
			errors.New("credentials in the URL's query are refused (proxies and logs keep URLs): send the header \"Authorization: Bearer <token>\""), nil))
		return
	}
	if len(f.tokens) > 0 && !info.health {
		if label, err := f.authenticate(r); err != nil {
			f.refuse(sw, r, rec, label, err)
			return
		}
	}
	if limit := f.s.cfg.MaxBodyBytes + envelopeBytes; r.ContentLength > limit {
		f.refuse(sw, r, rec, rejectBodyTooLarge, newError(connect.CodeResourceExhausted, stockctlv1.ErrorReason_ERROR_REASON_BODY_TOO_LARGE,
			fmt.Errorf("request body of %d bytes is larger than the server accepts (%d)", r.ContentLength, f.s.cfg.MaxBodyBytes), nil))
		return
	}
	if !info.health {
		kind, slots := kindShort, f.short
		if info.long {
			kind, slots = kindLong, f.long
		}
		// Never queue: a call beyond the bound is refused now, so that a
		// storm costs a header parse per call, not a goroutine and a body
		// held while waiting.
		select {
		case slots <- struct{}{}:
		default:
			f.refuse(sw, r, rec, rejectOverloaded, newError(connect.CodeResourceExhausted, stockctlv1.ErrorReason_ERROR_REASON_OVERLOADED,
				fmt.Errorf("the server is at its bound of %d %s calls in flight: retry shortly, or another server", cap(slots), kind), nil,
				retryAfter(100*time.Millisecond)))
			return
		}
		gauge := f.s.metrics.inflight.WithLabelValues(kind)
		gauge.Inc()
		defer func() {
			gauge.Dec()
			<-slots
		}()
	}
	f.next.ServeHTTP(sw, r.WithContext(withRecord(r.Context(), rec)))
	// The answer is not sent in full before ServeHTTP returns (gRPC's
	// trailers, HTTP/1.1's buffer). A caller that went away before (its
	// deadline, a reset stream) never learns of a hold granted to it.
	// Nor does a caller whose deadline passed: the server's deadline is
	// the later of the two.
	if rec.abandon != nil && (r.Context().Err() != nil || (!rec.deadline.IsZero() && !time.Now().Before(rec.deadline))) {
		rec.abandon()
	}
}

func (f *front) refuse(w http.ResponseWriter, r *http.Request, rec *callRecord, label string, ce *connect.Error) {
	rec.code = ce.Code().String()
	f.s.metrics.rejected.WithLabelValues(label).Inc()
	_ = f.errw.Write(w, r, ce)
}

// credentialKeys are query parameter names that carry credentials in other
// APIs; stockctl takes none in the URL.
var credentialKeys = map[string]bool{
	"access_token": true, "token": true, "bearer": true, "auth": true, "authorization": true,
	"api_key": true, "apikey": true, "api-key": true, "key": true, "password": true, "secret": true,
}

// credentialInURL reports whether r's query names a credential or carries
// one of the server's tokens under any name.
func (f *front) credentialInURL(r *http.Request) bool {
	if r.URL.RawQuery == "" {
		return false
	}
	for k, vs := range r.URL.Query() {
		if credentialKeys[strings.ToLower(k)] {
			return true
		}
		for _, v := range vs {
			if f.tokenMatches(v) {
				return true
			}
		}
	}
	return false
}

// authenticate checks the bearer token; on failure it returns the
// rejection label and the error to send.
func (f *front) authenticate(r *http.Request) (string, *connect.Error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return rejectTokenMissing, unauthenticated(stockctlv1.ErrorReason_ERROR_REASON_TOKEN_MISSING,
			"this server needs the header \"Authorization: Bearer <token>\"")
	}
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return rejectTokenInvalid, unauthenticated(stockctlv1.ErrorReason_ERROR_REASON_TOKEN_INVALID,
			"the Authorization header is not \"Bearer <token>\"")
	}
	if !f.tokenMatches(strings.TrimSpace(tok)) {
		return rejectTokenInvalid, unauthenticated(stockctlv1.ErrorReason_ERROR_REASON_TOKEN_INVALID,
			"the bearer token is not one this server accepts")
	}
	return "", nil
}

func unauthenticated(r stockctlv1.ErrorReason, msg string) *connect.Error {
	ce := newError(connect.CodeUnauthenticated, r, errors.New(msg), nil)
	ce.Meta().Set("WWW-Authenticate", `Bearer realm="stockctl"`)
	return ce
}

// tokenMatches compares candidate with every token in constant time: the
// digests have one length whatever the candidate's, and every token is
// compared, so neither the length nor the position of a match shows in the
// time taken.
func (f *front) tokenMatches(candidate string) bool {
	d := sha256.Sum256([]byte(candidate))
	match := 0
	for i := range f.tokens {
		match |= subtle.ConstantTimeCompare(d[:], f.tokens[i][:])
	}
	return match == 1
}

// statusWriter remembers the HTTP status of a response, for the code label
// of calls that never reached a handler.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush and Unwrap keep streaming working through the wrapper.
func (w *statusWriter) Flush() {
	if fl, ok := w.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// code is the gRPC code of a response no handler labelled: gRPC and
// gRPC-Web carry it in a trailer (or a header when there is no body), the
// Connect protocol in the HTTP status.
func (w *statusWriter) code() string {
	h := w.Header()
	for _, k := range []string{"Grpc-Status", http.TrailerPrefix + "Grpc-Status"} {
		if v := h.Get(k); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n == 0 {
				return "ok"
			}
			return connect.Code(n).String()
		}
	}
	return httpCode(w.status)
}

func httpCode(status int) string {
	switch status {
	case 0, http.StatusOK:
		return "ok"
	case http.StatusBadRequest, http.StatusUnsupportedMediaType:
		return connect.CodeInvalidArgument.String()
	case http.StatusUnauthorized:
		return connect.CodeUnauthenticated.String()
	case http.StatusForbidden:
		return connect.CodePermissionDenied.String()
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return connect.CodeUnimplemented.String()
	case http.StatusConflict:
		return connect.CodeAborted.String()
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return connect.CodeResourceExhausted.String()
	case http.StatusServiceUnavailable:
		return connect.CodeUnavailable.String()
	case http.StatusGatewayTimeout, http.StatusRequestTimeout:
		return connect.CodeDeadlineExceeded.String()
	case 499:
		return connect.CodeCanceled.String()
	}
	if status >= 500 {
		return connect.CodeInternal.String()
	}
	return connect.CodeUnknown.String()
}

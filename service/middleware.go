package service

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	long     bool // may last as long as the caller wants: the long bound
	health   bool // grpc.health.v1: no token, no shedding (load balancers)
	readBody bool // one request message (unary, server stream): read whole before a slot
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

	reading  chan struct{}  // a slot per request body being read
	perToken []atomic.Int64 // short calls in flight and bodies being read, by token
	connMu   sync.Mutex
	perConn  map[string]int // bodies being read, by connection (its remote address)
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
	rec.rc = http.NewResponseController(sw)
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
	tok := -1 // the caller's token's index
	if len(f.tokens) > 0 && !info.health {
		var label string
		var err *connect.Error
		if tok, label, err = f.authenticate(r); err != nil {
			f.refuse(sw, r, rec, label, err)
			return
		}
	}
	if limit := f.s.cfg.MaxBodyBytes + envelopeBytes; r.ContentLength > limit {
		f.refuse(sw, r, rec, rejectBodyTooLarge, newError(connect.CodeResourceExhausted, stockctlv1.ErrorReason_ERROR_REASON_BODY_TOO_LARGE,
			fmt.Errorf("request body of %d bytes is larger than the server accepts (%d)", r.ContentLength, f.s.cfg.MaxBodyBytes), nil))
		return
	}
	if info.readBody && !info.health {
		// The body first, under BodyTimeout and outside the slots: a
		// caller that sends it slowly holds no slot of the calls that run.
		body, label, ce := f.readBody(sw, r, tok)
		if ce != nil {
			f.refuse(sw, r, rec, label, ce)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	if !info.health {
		if !info.long && tok >= 0 {
			n := f.perToken[tok].Add(1)
			defer f.perToken[tok].Add(-1)
			if n > int64(f.s.cfg.MaxInflightPerToken) {
				f.refuse(sw, r, rec, rejectOverloaded, overloaded(fmt.Sprintf("this token has %d calls in flight, its bound (of %d for all)", f.s.cfg.MaxInflightPerToken, cap(f.short))))
				return
			}
		}
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
			f.refuse(sw, r, rec, rejectOverloaded, overloaded(fmt.Sprintf("the server is at its bound of %d %s calls in flight", cap(slots), kind)))
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
	if sw.unsupported && !sw.wrote {
		_, _ = sw.ResponseWriter.Write(unsupportedBody(r, sw.Header().Get("Accept-Post")))
	}
	// The answer is not sent in full before ServeHTTP returns (gRPC's
	// trailers, HTTP/1.1's buffer). A caller that went away before (its
	// deadline, a reset stream) never learns of a hold granted to it.
	// (The call's deadline is no sign: a caller rounds its timeout down
	// when it sends it, so the server's deadline can pass first.)
	if rec.abandon != nil && r.Context().Err() != nil {
		rec.abandon()
	}
}

func overloaded(why string) *connect.Error {
	return newError(connect.CodeResourceExhausted, stockctlv1.ErrorReason_ERROR_REASON_OVERLOADED,
		errors.New(why+": retry shortly, or another server"), nil, retryAfter(100*time.Millisecond))
}

// readBody reads r's body whole, within BodyTimeout and the size limit,
// counted against the bounds of bodies being read: the server's, the
// connection's and the token's (tok, -1 for none). On failure it returns
// the rejection label and the error to send.
func (f *front) readBody(w http.ResponseWriter, r *http.Request, tok int) ([]byte, string, *connect.Error) {
	select {
	case f.reading <- struct{}{}:
		defer func() { <-f.reading }()
	default:
		return nil, rejectOverloaded, overloaded(fmt.Sprintf("the server is reading its bound of %d request bodies", cap(f.reading)))
	}
	conn := r.RemoteAddr
	f.connMu.Lock()
	n := f.perConn[conn] + 1
	if n <= f.s.cfg.MaxBodiesPerConn {
		f.perConn[conn] = n
	}
	f.connMu.Unlock()
	if n > f.s.cfg.MaxBodiesPerConn {
		return nil, rejectOverloaded, overloaded(fmt.Sprintf("this connection is sending its bound of %d request bodies", f.s.cfg.MaxBodiesPerConn))
	}
	defer func() {
		f.connMu.Lock()
		if f.perConn[conn]--; f.perConn[conn] == 0 {
			delete(f.perConn, conn)
		}
		f.connMu.Unlock()
	}()
	if tok >= 0 {
		n := f.perToken[tok].Add(1)
		defer f.perToken[tok].Add(-1)
		if n > int64(f.s.cfg.MaxInflightPerToken) {
			return nil, rejectOverloaded, overloaded(fmt.Sprintf("this token has %d calls in flight or sending their bodies, its bound", f.s.cfg.MaxInflightPerToken))
		}
	}

	limit := f.s.cfg.MaxBodyBytes + envelopeBytes
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(f.s.cfg.BodyTimeout)) == nil
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if deadline {
		_ = rc.SetReadDeadline(time.Time{})
	}
	switch {
	case err != nil && (errors.Is(err, os.ErrDeadlineExceeded) || r.Context().Err() == nil):
		if r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		return nil, rejectBodyTimeout, newError(connect.CodeDeadlineExceeded, stockctlv1.ErrorReason_ERROR_REASON_DEADLINE_EXCEEDED,
			fmt.Errorf("the request body did not arrive whole within %v (%d bytes came): %v", f.s.cfg.BodyTimeout, len(body), err), nil)
	case err != nil:
		return nil, rejectBodyTimeout, newError(connect.CodeCanceled, stockctlv1.ErrorReason_ERROR_REASON_CANCELED, err, nil)
	case int64(len(body)) > limit:
		return nil, rejectBodyTooLarge, newError(connect.CodeResourceExhausted, stockctlv1.ErrorReason_ERROR_REASON_BODY_TOO_LARGE,
			fmt.Errorf("request body is larger than the server accepts (%d bytes)", f.s.cfg.MaxBodyBytes), nil)
	}
	return body, "", nil
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

// authenticate checks the bearer token and returns its index; on failure
// it returns the rejection label and the error to send.
func (f *front) authenticate(r *http.Request) (int, string, *connect.Error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return -1, rejectTokenMissing, unauthenticated(stockctlv1.ErrorReason_ERROR_REASON_TOKEN_MISSING,
			"this server needs the header \"Authorization: Bearer <token>\"")
	}
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return -1, rejectTokenInvalid, unauthenticated(stockctlv1.ErrorReason_ERROR_REASON_TOKEN_INVALID,
			"the Authorization header is not \"Bearer <token>\"")
	}
	i := f.tokenIndex(strings.TrimSpace(tok))
	if i < 0 {
		return -1, rejectTokenInvalid, unauthenticated(stockctlv1.ErrorReason_ERROR_REASON_TOKEN_INVALID,
			"the bearer token is not one this server accepts")
	}
	return i, "", nil
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
func (f *front) tokenMatches(candidate string) bool { return f.tokenIndex(candidate) >= 0 }

// tokenIndex is tokenMatches with the index of the token matched (-1:
// none), found in constant time too.
func (f *front) tokenIndex(candidate string) int {
	d := sha256.Sum256([]byte(candidate))
	idx := -1
	for i := range f.tokens {
		idx = subtle.ConstantTimeSelect(subtle.ConstantTimeCompare(d[:], f.tokens[i][:]), i, idx)
	}
	return idx
}

// statusWriter remembers the HTTP status of a response, for the code label
// of calls that never reached a handler.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool // a body was written
	// unsupported is set when a handler answered 415 (a content type it
	// does not speak) with no body yet: front writes one.
	unsupported bool
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		if code == http.StatusUnsupportedMediaType && w.Header().Get("Content-Type") == "" {
			w.unsupported = true
			w.Header().Set("Content-Type", "application/json")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// unsupportedBody is the body of a 415: which content type came and which
// this server accepts (Connect sets them in Accept-Post), as a Connect
// error in JSON, which a person with curl can read.
func unsupportedBody(r *http.Request, accepted string) []byte {
	got := r.Header.Get("Content-Type")
	what := fmt.Sprintf("the content type %q is not one this server speaks", got)
	if got == "" {
		what = "the request has no Content-Type"
	}
	if accepted == "" {
		accepted = "application/json, application/proto, application/grpc, application/grpc-web"
	}
	b, _ := json.Marshal(map[string]string{
		"code":    connect.CodeInvalidArgument.String(),
		"message": what + "; it accepts: " + accepted + " (with curl: -H 'Content-Type: application/json')",
	})
	return append(b, '\n')
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

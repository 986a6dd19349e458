package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// syncBuffer is a bytes.Buffer safe for the goroutines that write a
// command's output (a lock's child, the rebalancer).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// result is what one in-process run of stockctl produced.
type result struct {
	code           int
	stdout, stderr string
}

// runCtx runs stockctl in-process with args (no program name) under ctx;
// stdout and stderr are the given buffers.
func runCtx(ctx context.Context, stdout, stderr *syncBuffer, args ...string) int {
	app := New()
	app.Writer = stdout
	app.ErrWriter = stderr
	app.Reader = strings.NewReader("")
	return Run(ctx, app, append([]string{"stockctl"}, args...))
}

func run(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut syncBuffer
	code := runCtx(t.Context(), &out, &errOut, args...)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// env is a test's view of the shared etcd: commands run with its endpoint
// and a prefix of the test's own.
type env struct {
	t      *testing.T
	prefix string
}

// envs numbers the envs of the process, so that a test run again (-count)
// on the same shared etcd starts afresh.
var envs atomic.Int64

func newEnv(t *testing.T) *env {
	t.Helper()
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return &env{t: t, prefix: fmt.Sprintf("/test/%s-%d/", name, envs.Add(1))}
}

func (e *env) args(args ...string) []string {
	return append([]string{"--endpoints", shared.endpoints, "--prefix", e.prefix}, args...)
}

// run runs a command against the shared etcd under the test's prefix.
func (e *env) run(args ...string) result {
	e.t.Helper()
	return run(e.t, e.args(args...)...)
}

// ok runs a command that must succeed and returns its stdout.
func (e *env) ok(args ...string) string {
	e.t.Helper()
	r := e.run(args...)
	if r.code != 0 {
		e.t.Fatalf("stockctl %s: exit %d, stderr %q, stdout %q", strings.Join(args, " "), r.code, r.stderr, r.stdout)
	}
	return r.stdout
}

// json runs a command with -o json that must succeed, decoding its output
// into v.
func (e *env) json(v any, args ...string) {
	e.t.Helper()
	out := e.ok(append([]string{"-o", "json"}, args...)...)
	decode(e.t, out, v)
}

// fails runs a command that must exit with code and name want on stderr,
// with nothing on stdout.
func (e *env) fails(code int, want string, args ...string) result {
	e.t.Helper()
	r := e.run(args...)
	checkFails(e.t, r, code, want, args)
	return r
}

func checkFails(t *testing.T, r result, code int, want string, args []string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("stockctl %s: exit %d, want %d; stderr %q", strings.Join(args, " "), r.code, code, r.stderr)
	}
	if !strings.Contains(r.stderr, want) {
		t.Fatalf("stockctl %s: stderr %q does not say %q", strings.Join(args, " "), r.stderr, want)
	}
	if !strings.HasPrefix(r.stderr, "stockctl: ") {
		t.Fatalf("stockctl %s: stderr %q does not start with \"stockctl: \"", strings.Join(args, " "), r.stderr)
	}
}

func decode(t *testing.T, s string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
}

// keysOf decodes a JSON object and returns its field names, sorted.
func keysOf(t *testing.T, s string) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	return slices.Sorted(maps.Keys(m))
}

// checkShape fails unless the JSON object s has exactly the fields want.
func checkShape(t *testing.T, what, s string, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := keysOf(t, s); !slices.Equal(got, want) {
		t.Fatalf("%s JSON fields %v, want %v\n%s", what, got, want, s)
	}
}

// fingerprint is every key under a prefix with its mod revision: equal
// fingerprints mean nothing under the prefix changed.
func fingerprint(t *testing.T, prefix string) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := shared.client.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, kv := range resp.Kvs {
		m[string(kv.Key)] = kv.ModRevision
	}
	return m
}

package etcdtest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// logRecorder is a testing.TB whose Logf is recorded.
type logRecorder struct {
	testing.TB
	mu   sync.Mutex
	logs []string
}

func (r *logRecorder) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

func (r *logRecorder) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.logs, "\n")
}

// A hang guard that runs out logs every goroutine's stack (this test's
// own included); one that is cancelled, or whose test ends first, logs
// nothing.
func TestHangGuardDumpsGoroutines(t *testing.T) {
	t.Run("runs out", func(t *testing.T) {
		r := &logRecorder{TB: t}
		ctx, cancel := hangContext(r, 10*time.Millisecond)
		defer cancel()
		<-ctx.Done()
		WaitFor(t, "the dump", time.Minute, func() bool { return strings.Contains(r.all(), "TestHangGuardDumpsGoroutines") })
		if !strings.Contains(r.all(), "the hang guard ran out after 10ms") {
			t.Fatalf("log: %s", r.all())
		}
	})
	for _, tc := range []struct {
		name string
		end  func(cancel func())
	}{
		{"cancelled", func(cancel func()) { cancel() }},
		{"test ends first", func(func()) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &logRecorder{TB: t}
			t.Run("inner", func(t *testing.T) {
				r.TB = t
				_, cancel := hangContext(r, time.Hour)
				tc.end(cancel)
			})
			if got := r.all(); got != "" {
				t.Fatalf("logged %q", got)
			}
		})
	}
}

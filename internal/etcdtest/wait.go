package etcdtest

import (
	"bytes"
	"context"
	"errors"
	"runtime/pprof"
	"sync"
	"testing"
	"time"
)

// MinWait is the least time WaitFor (and the tests' other waits, through
// HangLimit) gives a condition before calling it a hang. Limits chosen on
// an idle machine (5 s, 30 s) ran out on a 2-core machine with four busy
// loops beside the suite (issue 28): a wait that holds costs nothing more
// for a higher limit, and only a hang is reported later.
const MinWait = 2 * time.Minute

// TestHang is how long a whole concurrent test (a sale, a failover, a
// chaos run) may take before its guard calls it a hang. Guards of 2 and 3
// minutes, chosen on an idle machine, ran out with -race beside four busy
// loops and other work (issue 28: a 4-coordinator sale of 2,000 units took
// 209 s); go test's -timeout 30m still bounds a package.
const TestHang = 10 * time.Minute

// HangContext is t's context, ended after TestHang: the guard that turns a
// stuck call into a failure of the test with the call's error. Never a
// measure of speed. When the guard runs out it logs every goroutine's
// stack first, so that a hang can be told from a slow machine (a sale that
// ran out of its 10 minutes beside busy loops left only "context deadline
// exceeded").
func HangContext(t testing.TB) (context.Context, context.CancelFunc) {
	return hangContext(t, TestHang)
}

func hangContext(t testing.TB, limit time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	var dumped sync.WaitGroup
	dumped.Add(1)
	stop := context.AfterFunc(ctx, func() {
		defer dumped.Done()
		if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			return
		}
		var b bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Logf("the hang guard ran out after %v; every goroutine now:\n%s", limit, b.String())
	})
	t.Cleanup(func() {
		if stop() {
			dumped.Done() // never ran
		}
		dumped.Wait()
		cancel()
	})
	return ctx, cancel
}

// HangLimit is limit, or MinWait if that is longer: what a wait that only
// catches a hang should allow.
func HangLimit(limit time.Duration) time.Duration { return max(limit, MinWait) }

// WaitFor polls cond until it holds, and fails the test if it does not
// within limit (at least MinWait). limit only catches a hang: make it
// generous (10× what the slowest machine needs), never a measure of speed.
func WaitFor(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	limit = HangLimit(limit)
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

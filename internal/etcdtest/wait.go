package etcdtest

import (
	"testing"
	"time"
)

// WaitFor polls cond until it holds, and fails the test if it does not
// within limit. limit only catches a hang: make it generous (10× what the
// slowest machine needs), never a measure of speed.
func WaitFor(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

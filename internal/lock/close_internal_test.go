package lock

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/etcdcall"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// Invariant: the key watch's check of a deleted key that was under way when
// Close began (keyDeleted, a goroutine of its own that asks etcd whether
// the lease lives) warns of nothing: the lease is gone because Close
// revoked it. Before, it logged "etcd session lost" and retired a session
// Close was ending anyway. keyEvent ignores events once Close has begun;
// this is the one started just before.
func TestKeyDeletedDuringCloseWarnsNothing(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	client := etcd.Client(t)
	var log etcdtest.WarnLog
	bg := background.NewGroup()
	e := New(client, etcdcall.KV(client), bg, Config{
		SessionTTL: 10 * time.Second, CohortMaxHandoffs: 32, CohortMaxHold: 100 * time.Millisecond,
		ReleaseTimeout: 5 * time.Second, TenureIdle: time.Second, Logger: slog.New(&log),
	})
	t.Cleanup(func() {
		bg.Stop()
		bg.Wait()
	})
	ctx := t.Context()
	h, err := e.Acquire(ctx, "/t/locks/k/", KindNamed, -1)
	if err != nil {
		t.Fatal(err)
	}
	own, q := h.Own(), h.Queue()
	if _, err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// The check the watch started for the revoke's deletion of own's key.
	e.keyDeleted(ctx, q, own, own.Rev()+1)
	if msgs := log.Messages(); len(msgs) > 0 {
		t.Fatalf("a key deleted by Close's revoke logged %q", msgs)
	}
}

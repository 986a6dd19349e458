package lock

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/etcdcall"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// newEngine returns an engine on client with the coordinator's defaults
// (changed by tweaks), closed (and its goroutines waited for) at the end
// of the test.
func newEngine(t *testing.T, client *clientv3.Client, tweaks ...func(*Config)) *Engine {
	t.Helper()
	bg := background.NewGroup()
	cfg := Config{
		SessionTTL: 10 * time.Second, CohortMaxHandoffs: 32, CohortMaxHold: 100 * time.Millisecond,
		ReleaseTimeout: 5 * time.Second, TenureIdle: time.Second,
	}
	for _, tweak := range tweaks {
		tweak(&cfg)
	}
	e := New(client, etcdcall.KV(client), bg, cfg)
	t.Cleanup(func() {
		_, _ = e.Close()
		bg.Stop()
		bg.Wait()
	})
	return e
}

// Invariant (etcd issue 22082): a late or repeated delete of a lock key made
// for an earlier hold never removes a newer key of the same session, even
// though both have the same name (one key per session and lock).
func TestStaleDeleteKeepsNewerKey(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	e := newEngine(t, etcd.Client(t))
	ctx := t.Context()

	first, err := e.Acquire(ctx, "/t/locks/k/", KindNamed, -1)
	if err != nil {
		t.Fatal(err)
	}
	staleKey, staleRev := first.Own().Key(), first.Own().Rev()
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := e.Acquire(ctx, "/t/locks/k/", KindNamed, -1)
	if err != nil {
		t.Fatal(err)
	}
	if second.Own().Key() != staleKey {
		t.Fatalf("keys differ (%s, %s): the test needs the same session", staleKey, second.Own().Key())
	}
	// The retried delete of the first hold arrives now.
	if err := e.deleteGuarded(ctx, staleKey, staleRev, ""); err != nil {
		t.Fatal(err)
	}
	resp, err := second.Txn(ctx).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("the newer hold was removed by a stale delete (err %v)", err)
	}
	if err := second.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

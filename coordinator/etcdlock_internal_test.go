package coordinator

import (
	"testing"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// Invariant (etcd issue 22082): a late or repeated delete of a lock key made
// for an earlier hold never removes a newer key of the same session, even
// though both have the same name (one key per session and lock).
func TestStaleDeleteKeepsNewerKey(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	c, err := New(etcd.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := t.Context()

	first, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	staleKey, staleRev := first.Key(), first.Token()
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if second.Key() != staleKey {
		t.Fatalf("keys differ (%s, %s): the test needs the same session", staleKey, second.Key())
	}
	// The retried delete of the first hold arrives now.
	if err := c.deleteGuarded(ctx, staleKey, staleRev); err != nil {
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

package etcdwatch_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/etcdwatch"
)

// Invariant: a view kept by Follow (load, then apply) ends equal to etcd's
// keys under the prefix, whatever was written before and during the watch,
// and never holds a key outside the prefix. (A watch broken by compaction
// and started again from a full read is tested through its users:
// coordinator's TestLockViewAfterCompaction.)
func TestFollowKeepsTheView(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cli := etcd.Client(t)
	ctx := t.Context()
	const pfx = "/follow/"
	for i := range 20 {
		if _, err := cli.Put(ctx, fmt.Sprintf("%sk%02d", pfx, i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, "/followers/outside", "v"); err != nil { // shares the prefix's text, not its slash
		t.Fatal(err)
	}

	var mu sync.Mutex
	view := map[string]bool{}
	loads := 0
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		etcdwatch.Follow(fctx, cli, cli, pfx, func(resp *clientv3.GetResponse) {
			mu.Lock()
			defer mu.Unlock()
			loads++
			clear(view)
			for _, kv := range resp.Kvs {
				view[string(kv.Key)] = true
			}
		}, func(evs []*clientv3.Event) {
			mu.Lock()
			defer mu.Unlock()
			for _, ev := range evs {
				if ev.Type == mvccpb.DELETE {
					delete(view, string(ev.Kv.Key))
				} else {
					view[string(ev.Kv.Key)] = true
				}
			}
		}, func() {})
	}()

	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		key := fmt.Sprintf("%sk%02d", pfx, r.IntN(40))
		var err error
		if r.IntN(3) == 0 {
			_, err = cli.Delete(ctx, key)
		} else {
			_, err = cli.Put(ctx, key, "v")
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cli.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, kv := range resp.Kvs {
		want[string(kv.Key)] = true
	}
	etcdtest.WaitFor(t, "the view to equal etcd's keys", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return maps.Equal(view, want)
	})
	cancel()
	<-done // Follow returns when its ctx ends
	mu.Lock()
	defer mu.Unlock()
	if loads < 1 || view["/followers/outside"] {
		t.Fatalf("loads %d, view %v", loads, view)
	}
}

package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// Direct seller seats on a real etcd 3.4 (Debian's etcd-server; skipped
// when no etcd binary is available): three processes that sold directly
// hold seats 0, 1 and 2, each under a lease of its own that lives; a
// process that closes frees its seat. A claim that failed would only leave
// the processes to the hash, silently: this checks the claims land there.
func TestSeatsOnEtcd34(t *testing.T) {
	etcd := etcdtest.NewExternal(t)
	client := etcd.Client(t)
	t.Logf("etcd %s at %s", etcd.Version(), etcd.Endpoints()[0])
	ctx := t.Context()
	const sku, procs = "seats34", 3
	cs := make([]*coordinator.Coordinator, procs)
	for i := range cs {
		cs[i] = newCoord(t, etcd.Endpoints())
	}
	if _, err := cs[0].CreateSKU(ctx, sku, coordinator.SKUConfig{Total: 60, Segments: 6, InitialFill: 60}); err != nil {
		t.Fatal(err)
	}
	for i, c := range cs {
		if _, err := c.Allocate(ctx, sku, fmt.Sprint("o-", i), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	prefix := coordinator.DefaultPrefix + "sellers/"
	held := func() (names []string, leases []int64) {
		resp, err := client.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			names = append(names, string(kv.Key[len(prefix):]))
			leases = append(leases, kv.Lease)
		}
		slices.Sort(names)
		return names, leases
	}
	// Each claim is a few round trips after the process's first direct
	// commit: wait for them (bounded).
	var names []string
	var leases []int64
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if names, leases = held(); len(names) == procs || time.Now().After(deadline) {
			break
		}
	}
	if !slices.Equal(names, []string{"0", "1", "2"}) {
		t.Fatalf("seats held on etcd %s: %v, want 0, 1 and 2", etcd.Version(), names)
	}
	seen := map[int64]bool{}
	for _, l := range leases {
		ttl, err := client.TimeToLive(ctx, clientv3.LeaseID(l))
		if err != nil || ttl.TTL <= 0 {
			t.Fatalf("seat lease %x: %+v, %v; want a live lease", l, ttl, err)
		}
		if seen[l] {
			t.Fatalf("two seats under lease %x", l)
		}
		seen[l] = true
	}
	if err := cs[1].Close(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if names, _ = held(); len(names) == procs-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after a process closed, seats held: %v", names)
		}
	}
}

package segments

import (
	"testing"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// The space reserve: a key space's first CreateSKU sets it aside once;
// releasing it frees its bytes (also under etcd's NOSPACE alarm, which
// takes deletes: cmd/stockctl/cli's TestNoSpaceAndRecovery), restoring it
// writes it again only where it is absent, and a later engine's CreateSKU
// writes it again when it is missing.
func TestSpaceReserve(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	withClient := func(c *engineTestConfig) { c.client = client }
	e := etcdEngine(t, withClient)
	ctx := t.Context()
	reserve := func() (int, int64) {
		t.Helper()
		resp, err := client.Get(ctx, e.keys.SpaceReserve())
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return 0, 0
		}
		return len(resp.Kvs[0].Value), resp.Kvs[0].ModRevision
	}
	if n, _ := reserve(); n != 0 {
		t.Fatalf("a reserve of %d bytes before any SKU was created", n)
	}
	for i, sku := range []string{"a", "b", "c"} {
		if _, err := e.CreateSKU(ctx, sku, SKUConfig{Total: 10, Segments: 2}); err != nil {
			t.Fatal(err)
		}
		n, mod := reserve()
		if n != SpaceReserveBytes {
			t.Fatalf("after CreateSKU %s: a reserve of %d bytes, want %d", sku, n, SpaceReserveBytes)
		}
		if i == 0 {
			continue
		}
		// Written once: later creations leave it as it is.
		resp, err := client.Get(ctx, e.keys.SpaceReserve())
		if err != nil || resp.Kvs[0].Version != 1 {
			t.Fatalf("after CreateSKU %s the reserve has version %d (mod %d), want 1: %v", sku, resp.Kvs[0].Version, mod, err)
		}
	}
	freed, err := e.ReleaseSpaceReserve(ctx)
	if err != nil || freed != SpaceReserveBytes {
		t.Fatalf("ReleaseSpaceReserve: %d bytes, %v; want %d", freed, err, SpaceReserveBytes)
	}
	if n, _ := reserve(); n != 0 {
		t.Fatalf("a reserve of %d bytes after its release", n)
	}
	if freed, err := e.ReleaseSpaceReserve(ctx); err != nil || freed != 0 {
		t.Fatalf("ReleaseSpaceReserve with none: %d bytes, %v; want 0", freed, err)
	}
	// This engine has looked once: its creations do not write it again.
	if _, err := e.CreateSKU(ctx, "d", SKUConfig{Total: 10, Segments: 2}); err != nil {
		t.Fatal(err)
	}
	if n, _ := reserve(); n != 0 {
		t.Fatalf("the same engine's CreateSKU wrote the reserve again (%d bytes)", n)
	}
	// A new engine's first creation does.
	if _, err := etcdEngine(t, withClient).CreateSKU(ctx, "e", SKUConfig{Total: 10, Segments: 2}); err != nil {
		t.Fatal(err)
	}
	if n, _ := reserve(); n != SpaceReserveBytes {
		t.Fatalf("a new engine's CreateSKU left a reserve of %d bytes, want %d", n, SpaceReserveBytes)
	}
	if wrote, err := e.RestoreSpaceReserve(ctx); err != nil || wrote {
		t.Fatalf("RestoreSpaceReserve over a reserve: wrote %v, %v; want false", wrote, err)
	}
	if _, err := e.ReleaseSpaceReserve(ctx); err != nil {
		t.Fatal(err)
	}
	if wrote, err := e.RestoreSpaceReserve(ctx); err != nil || !wrote {
		t.Fatalf("RestoreSpaceReserve with none: wrote %v, %v; want true", wrote, err)
	}
	if n, _ := reserve(); n != SpaceReserveBytes {
		t.Fatalf("after RestoreSpaceReserve a reserve of %d bytes, want %d", n, SpaceReserveBytes)
	}
}

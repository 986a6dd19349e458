package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// SKUs born with their sellers' homes on a real etcd 3.4 (Debian's
// etcd-server; skipped when no etcd binary is available): three selling
// processes hold their seats from the start (WithSellerSeat), an admin
// process creates the SKU, and each seller's first orders write their
// records alone, counted in etcd's own history (no takeover, no claim:
// the control, a seller seated only after the creation, writes one key
// more). The books balance on that etcd.
func TestBornHomesOnEtcd34(t *testing.T) {
	etcd := etcdtest.NewExternal(t)
	client := etcd.Client(t)
	t.Logf("etcd %s at %s", etcd.Version(), etcd.Endpoints()[0])
	ctx := t.Context()
	admin := newCoord(t, etcd.Endpoints())
	for _, tc := range []struct {
		name     string
		seated   bool // the sellers hold their seats before the SKU is created
		wantKeys int  // keys 3 sellers × 4 orders write
	}{
		{name: "seated", seated: true, wantKeys: 12},
		{name: "not seated", seated: false, wantKeys: 15}, // a claim each
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []coordinator.Option
			if tc.seated {
				opts = append(opts, coordinator.WithSellerSeat())
			}
			sellers := make([]*coordinator.Coordinator, 3)
			for i := range sellers {
				sellers[i] = newCoord(t, etcd.Endpoints(), opts...)
			}
			sku := "born34-" + tc.name[:3]
			if _, err := admin.CreateSKU(ctx, sku, coordinator.SKUConfig{Total: 60, Segments: 6, InitialFill: 60}); err != nil {
				t.Fatal(err)
			}
			start, err := client.Get(ctx, "rev")
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range sellers {
				for j := range 4 {
					if _, err := c.Allocate(ctx, sku, fmt.Sprintf("o-%d-%d", i, j), 1, ""); err != nil {
						t.Fatal(err)
					}
				}
			}
			end, err := client.Get(ctx, "rev")
			if err != nil {
				t.Fatal(err)
			}
			puts := 0
			for _, key := range etcdtest.KeysPut(t, client, coordinator.DefaultPrefix, start.Header.Revision, end.Header.Revision) {
				if !strings.HasPrefix(key, coordinator.DefaultPrefix+"sellers/") {
					puts++ // a seat claimed at a first order is not the order's
				}
			}
			if puts != tc.wantKeys {
				t.Fatalf("12 first orders wrote %d keys on etcd %s; want %d", puts, etcd.Version(), tc.wantKeys)
			}
			r, err := admin.Audit(ctx, sku)
			if err != nil || !r.OK || r.Allocated != 12 {
				t.Fatalf("audit on etcd %s: %+v, %v", etcd.Version(), r, err)
			}
			for _, c := range sellers {
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

package cli

import (
	"context"
	"fmt"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

func auditCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "audit",
		Usage:     "check a SKU's books: total = pool + segments + active orders (exit 0 only if they balance)",
		ArgsUsage: "SKU",
		Action:    auditAction,
	}
}

// auditView is the result of audit.
type auditView struct {
	SKU            string   `json:"sku"`
	Cluster        string   `json:"cluster,omitempty"` // with several clusters: the one that holds the SKU
	OK             bool     `json:"ok"`
	Total          int64    `json:"total"`
	Pool           int64    `json:"pool"`
	Segments       int64    `json:"segments"`
	Allocated      int64    `json:"allocated"`
	Reserved       int64    `json:"reserved"`
	Confirmed      int64    `json:"confirmed"`
	Orders         int64    `json:"orders"`
	ReleasedOrders int64    `json:"releasedOrders"`
	ExpiredOrders  int64    `json:"expiredOrders"`
	Buyers         int64    `json:"buyers"`
	Archived       int64    `json:"archived"`
	ArchivedOrders int64    `json:"archivedOrders"`
	Deliveries     int64    `json:"deliveries"`
	Delivered      int64    `json:"delivered"`
	Revision       int64    `json:"revision"`
	Problems       []string `json:"problems"`
}

func auditViewOf(r *coordinator.AuditReport) auditView {
	return auditView{SKU: r.SKU, OK: r.OK, Total: r.Total, Pool: r.Pool, Segments: r.Segments, Allocated: r.Allocated,
		Reserved: r.Reserved, Confirmed: r.Confirmed, ExpiredOrders: r.ExpiredOrders, Buyers: r.Buyers,
		Orders: r.Orders, ReleasedOrders: r.ReleasedOrders, Deliveries: r.Deliveries, Delivered: r.Delivered,
		Revision: r.Revision, Problems: append([]string{}, r.Problems...), Archived: r.Archived, ArchivedOrders: r.ArchivedOrders}
}

func (v auditView) table() table {
	var t table
	t.add("SKU", v.SKU)
	if v.Cluster != "" {
		t.add("CLUSTER", v.Cluster)
	}
	verdict := "ok: the books balance"
	if !v.OK {
		verdict = "FAILED"
	}
	t.add("AUDIT", verdict)
	t.add("TOTAL", v.Total)
	t.add("POOL", v.Pool)
	t.add("SEGMENTS", v.Segments)
	t.add("ALLOCATED", fmt.Sprintf("%d in %d active orders (%d released, %d expired)", v.Allocated, v.Orders-v.ReleasedOrders-v.ExpiredOrders, v.ReleasedOrders, v.ExpiredOrders))
	t.add("RESERVED", fmt.Sprintf("%d in live reservations; %d confirmed or allocated", v.Reserved, v.Confirmed))
	if v.Buyers > 0 {
		t.add("BUYERS", fmt.Sprintf("%d per-user counters, each equal to its orders", v.Buyers))
	}
	if v.Deliveries > 0 {
		t.add("DELIVERIES", fmt.Sprintf("%d restocks, %d units", v.Deliveries, v.Delivered))
	}
	if v.ArchivedOrders > 0 {
		t.add("ARCHIVED", fmt.Sprintf("%d units in %d pruned orders", v.Archived, v.ArchivedOrders))
	}
	op := "="
	if v.Pool+v.Segments+v.Allocated+v.Archived != v.Total {
		op = "≠"
	}
	check := fmt.Sprintf("total %d %s pool %d + segments %d + allocated %d", v.Total, op, v.Pool, v.Segments, v.Allocated)
	if v.ArchivedOrders > 0 {
		check += fmt.Sprintf(" + archived %d", v.Archived)
	}
	t.add("CHECK", check)
	t.add("REVISION", v.Revision)
	for _, p := range v.Problems {
		t.notes = append(t.notes, "problem: "+p)
	}
	return t
}

func auditAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	sku, err := oneArg(c, "SKU", segments.ValidateSKU)
	if err != nil {
		return err
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		r, err := cn.coord.Audit(ctx, sku)
		if err != nil {
			return opFailed(ctx, err)
		}
		v := auditViewOf(r)
		v.Cluster, _ = cn.coord.ClusterOf(ctx, sku)
		if err := show(c, g, v); err != nil {
			return err
		}
		if !r.OK {
			return ucli.Exit(fmt.Errorf("audit of %s failed at revision %d: %s", sku, r.Revision, strings.Join(r.Problems, "; ")), ExitFailure)
		}
		return nil
	})
}

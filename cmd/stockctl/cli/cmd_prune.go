package cli

import (
	"context"
	"fmt"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/segments"
)

func pruneCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "prune",
		Usage: "archive a SKU's orders older than --older-than, so that etcd does not fill up over a long sale",
		Description: "Deletes the order records and order-ID claims of the SKU's orders created more than --older-than\n" +
			"ago, and counts them in the SKU's archive record in the same transactions: status and audit still\n" +
			"balance (the archived units stay allocated). Live reservations are kept. A pruned order's ID is\n" +
			"forgotten: a retry of it is a new order, and it can no longer be released, cancelled or confirmed.\n" +
			"So --older-than must be longer than any client may retry or return an order. With a per-user\n" +
			"limit, a pruned order no longer counts against its buyer. See docs/operations.md.",
		ArgsUsage: "SKU --older-than D",
		Flags: []ucli.Flag{
			&ucli.DurationFlag{Name: "older-than", Usage: "prune orders created longer ago than this, e.g. 720h (required)"},
		},
		Action: pruneAction,
	}
}

// pruneView is the result of prune: what this run archived, and the SKU's
// archive since its first prune.
type pruneView struct {
	SKU string `json:"sku"`
	// Before: orders created before it were pruned (RFC 3339, UTC).
	Before   time.Time   `json:"before"`
	Orders   int64       `json:"orders"`
	Units    int64       `json:"units"`
	Released int64       `json:"released"`
	Expired  int64       `json:"expired"`
	Buyers   int64       `json:"buyers"`
	Archive  archiveView `json:"archive"`
	Revision int64       `json:"revision"`
}

type archiveView struct {
	Orders   int64     `json:"orders"`
	Units    int64     `json:"units"`
	Released int64     `json:"released"`
	Expired  int64     `json:"expired"`
	Through  time.Time `json:"through"`
}

func (v pruneView) table() table {
	var t table
	t.add("SKU", v.SKU)
	t.add("PRUNED", fmt.Sprintf("%d orders created before %s (%d units sold, %d released, %d expired)",
		v.Orders, v.Before.Format(time.RFC3339), v.Units, v.Released, v.Expired))
	if v.Buyers > 0 {
		t.add("BUYERS", fmt.Sprintf("%d per-user counters lowered by their pruned orders", v.Buyers))
	}
	t.add("ARCHIVED", fmt.Sprintf("%d units in %d orders since the first prune", v.Archive.Units, v.Archive.Orders))
	t.add("REVISION", v.Revision)
	return t
}

func pruneAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	sku, err := oneArg(c, "SKU", segments.ValidateSKU)
	if err != nil {
		return err
	}
	if err := requireFlags(c, "older-than"); err != nil {
		return err
	}
	age := c.Duration("older-than")
	if age <= 0 {
		return usageError("invalid --older-than %v: must be positive (orders younger than it are kept)", age)
	}
	before := time.Now().Add(-age).UTC()
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		p, err := cn.coord.Prune(ctx, sku, before)
		if err != nil {
			if p != nil && p.Orders > 0 {
				// Each batch committed whole: the books balance, and a
				// second run goes on where this one stopped.
				err = fmt.Errorf("%w (after archiving %d orders: run it again to go on)", err, p.Orders)
			}
			return opFailed(ctx, err)
		}
		a := p.Archive
		return show(c, g, pruneView{SKU: sku, Before: before, Orders: p.Orders, Units: p.Units, Released: p.Released,
			Expired: p.Expired, Buyers: p.Buyers, Revision: p.Revision,
			Archive: archiveView{Orders: a.Orders, Units: a.Units, Released: a.Released, Expired: a.Expired, Through: a.Through}})
	})
}

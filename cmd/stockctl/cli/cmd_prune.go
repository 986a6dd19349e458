package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

func pruneCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "prune",
		Usage: "archive a SKU's orders older than --older-than, so that etcd does not fill up over a long sale",
		Description: "Archives the SKU's orders created more than --older-than ago: counts them in the SKU's archive\n" +
			"record and replaces each order's record by a small claim of its ID, in the same transactions, so\n" +
			"that status and audit still balance (the archived units stay allocated). Live reservations are\n" +
			"kept. A pruned order's ID is kept for --keep-ids (24h by default): a retry of the order is refused\n" +
			"(ORDER_PRUNED), never applied twice, and it can no longer be released, cancelled or confirmed.\n" +
			"Each prune forgets the IDs whose --keep-ids ended; a retry after that is a new order, so keep them\n" +
			"longer than any client may retry. With a per-user limit, a pruned order no longer counts against\n" +
			"its buyer. See docs/operations.md.",
		ArgsUsage: "SKU --older-than D [--keep-ids D]",
		Flags: []ucli.Flag{
			&ucli.DurationFlag{Name: "older-than", Usage: "prune orders created longer ago than this, e.g. 720h (required)"},
			&ucli.DurationFlag{Name: "keep-ids", Value: segments.DefaultPrunedIDRetention,
				Usage: "keep each pruned order's ID this long, so that a retry of it is refused (0: forget the IDs now, and every ID kept before)"},
		},
		Action: pruneAction,
	}
}

// pruneView is the result of prune: what this run archived, and the SKU's
// archive since its first prune.
type pruneView struct {
	SKU string `json:"sku"`
	// Before: orders created before it were pruned (RFC 3339, UTC).
	Before   time.Time `json:"before"`
	Orders   int64     `json:"orders"`
	Units    int64     `json:"units"`
	Released int64     `json:"released"`
	Expired  int64     `json:"expired"`
	Buyers   int64     `json:"buyers"`
	// KeepIDs is how long the pruned orders' IDs are kept; Forgotten
	// counts the IDs of earlier prunes forgotten by this one.
	KeepIDs   string      `json:"keepIds"`
	Forgotten int64       `json:"forgotten"`
	Archive   archiveView `json:"archive"`
	Revision  int64       `json:"revision"`
}

type archiveView struct {
	Orders   int64     `json:"orders"`
	Units    int64     `json:"units"`
	Released int64     `json:"released"`
	Expired  int64     `json:"expired"`
	Through  time.Time `json:"through"`
	// Claims counts the pruned orders whose IDs are still kept.
	Claims int64 `json:"claims"`
}

func (v pruneView) table() table {
	var t table
	t.add("SKU", v.SKU)
	t.add("PRUNED", fmt.Sprintf("%d orders created before %s (%d units sold, %d released, %d expired)",
		v.Orders, v.Before.Format(time.RFC3339), v.Units, v.Released, v.Expired))
	if v.Buyers > 0 {
		t.add("BUYERS", fmt.Sprintf("%d per-user counters lowered by their pruned orders", v.Buyers))
	}
	ids := fmt.Sprintf("kept %s (a retry of a pruned order is refused)", v.KeepIDs)
	if v.KeepIDs == "0s" {
		ids = "forgotten at once (a retry of a pruned order is a new order)"
	}
	if v.Forgotten > 0 {
		ids += fmt.Sprintf("; %d IDs of earlier prunes forgotten", v.Forgotten)
	}
	t.add("ORDER IDS", ids)
	t.add("ARCHIVED", fmt.Sprintf("%d units in %d orders since the first prune; %d of their IDs kept", v.Archive.Units, v.Archive.Orders, v.Archive.Claims))
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
	keep := c.Duration("keep-ids")
	if keep < 0 {
		return usageError("invalid --keep-ids %v: must be 0 (forget the pruned orders' IDs now) or more", keep)
	}
	before := time.Now().Add(-age).UTC()
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		p, err := cn.coord.Prune(ctx, sku, before, coordinator.KeepPrunedIDs(keep))
		if err != nil {
			if p != nil {
				// Each batch committed whole: the books balance, and a
				// second run goes on where this one stopped.
				var done []string
				if p.Orders > 0 {
					done = append(done, fmt.Sprintf("archiving %d orders", p.Orders))
				}
				if p.Forgotten > 0 {
					done = append(done, fmt.Sprintf("forgetting %d kept IDs", p.Forgotten))
				}
				if len(done) > 0 {
					err = fmt.Errorf("%w (after %s: run it again to go on)", err, strings.Join(done, " and "))
				}
			}
			return opFailed(ctx, err)
		}
		a := p.Archive
		return show(c, g, pruneView{SKU: sku, Before: before, Orders: p.Orders, Units: p.Units, Released: p.Released,
			Expired: p.Expired, Buyers: p.Buyers, KeepIDs: keep.String(), Forgotten: p.Forgotten, Revision: p.Revision,
			Archive: archiveView{Orders: a.Orders, Units: a.Units, Released: a.Released, Expired: a.Expired, Through: a.Through, Claims: a.Claims}})
	})
}

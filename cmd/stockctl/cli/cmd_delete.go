package cli

import (
	"context"
	"fmt"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/segments"
)

func deleteCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "delete",
		Usage: "delete a SKU that is done: every key it has in etcd",
		Description: "A SKU is done when no live reservation waits for a confirm or its expiry, and no process holds\n" +
			"or waits for the lock of its pool or a segment (a selling process keeps a segment about 10 s\n" +
			"after its last order there). Otherwise delete fails with exit 5, naming the reservation or the\n" +
			"lock's holder. Its orders are archived, then all its keys deleted in one transaction. A SKU that\n" +
			"still holds stock is deleted only with --force. Processes that sold it keep its segment count\n" +
			"cached until they restart: create the name again with the same segment count, or restart them.",
		ArgsUsage: "SKU [--force]",
		Flags: []ucli.Flag{
			&ucli.BoolFlag{Name: "force", Usage: "delete it even though its pool or segments still hold stock"},
		},
		Action: deleteAction,
	}
}

// deleteView is the result of delete: the SKU's books as it went.
type deleteView struct {
	SKU       string `json:"sku"`
	Total     int64  `json:"total"`
	Remaining int64  `json:"remaining"`
	Allocated int64  `json:"allocated"`
	Orders    int64  `json:"orders"`
	Revision  int64  `json:"revision"`
}

func (v deleteView) table() table {
	var t table
	t.add("SKU", v.SKU)
	t.add("DELETED", fmt.Sprintf("total %d: %d allocated in %d orders, %d left in the pool and segments", v.Total, v.Allocated, v.Orders, v.Remaining))
	t.add("REVISION", v.Revision)
	return t
}

func deleteAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	sku, err := oneArg(c, "SKU", segments.ValidateSKU)
	if err != nil {
		return err
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		if !c.Bool("force") {
			st, err := cn.coord.Status(ctx, sku)
			if err != nil {
				return opFailed(ctx, err)
			}
			if left := st.Remaining(); left > 0 {
				return ucli.Exit(fmt.Errorf("failed to delete %s: it still holds %d units in its pool and segments "+
					"(--force deletes them with it)", sku, left), ExitConflict)
			}
		}
		d, err := cn.coord.DeleteSKU(ctx, sku)
		if err != nil {
			return opFailed(ctx, err)
		}
		return show(c, g, deleteView{SKU: sku, Total: d.Total, Remaining: d.Remaining, Allocated: d.Total - d.Remaining,
			Orders: d.Orders, Revision: d.Revision})
	})
}

package cli

import (
	"context"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/segments"
)

func restockCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "restock",
		Usage:     "add a new delivery to a SKU's pool and total",
		ArgsUsage: "SKU --qty N",
		Flags: []ucli.Flag{
			&ucli.Int64Flag{Name: "qty", Usage: "units delivered (required)"},
		},
		Action: restockAction,
	}
}

// restockView is the result of restock.
type restockView struct {
	SKU      string `json:"sku"`
	Total    int64  `json:"total"`
	Pool     int64  `json:"pool"`
	Revision int64  `json:"revision"`
}

func (v restockView) table() table {
	var t table
	t.add("SKU", v.SKU)
	t.add("TOTAL", v.Total)
	t.add("POOL", v.Pool)
	t.add("REVISION", v.Revision)
	return t
}

func restockAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	sku, err := oneArg(c, "SKU", segments.ValidateSKU)
	if err != nil {
		return err
	}
	if err := requireFlags(c, "qty"); err != nil {
		return err
	}
	qty := c.Int64("qty")
	if err := segments.ValidateQty(qty); err != nil {
		return usageError("--qty: %v", err)
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		r, err := cn.coord.Restock(ctx, sku, qty)
		if err != nil {
			return opFailed(ctx, err)
		}
		return show(c, g, restockView{SKU: r.SKU, Total: r.Total, Pool: r.Pool, Revision: r.Revision})
	})
}

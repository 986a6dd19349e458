package cli

import (
	"context"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/segments"
)

func restockCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "restock",
		Usage:     "add a new delivery to a SKU's pool and total (idempotent by delivery ID)",
		ArgsUsage: "SKU --delivery ID --qty N",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "delivery", Usage: "delivery ID, unique across SKUs (a delivery note, a purchase order line); retrying it is safe (required)"},
			&ucli.Int64Flag{Name: "qty", Usage: "units delivered (required)"},
		},
		Action: restockAction,
	}
}

// restockView is the result of restock.
type restockView struct {
	SKU      string `json:"sku"`
	Delivery string `json:"delivery"`
	Qty      int64  `json:"qty"`
	Total    int64  `json:"total"`
	Pool     int64  `json:"pool"`
	Revision int64  `json:"revision"`
	// Replayed: the delivery ID had already been applied; nothing was added
	// now and the fields describe the first application.
	Replayed bool `json:"replayed"`
}

func (v restockView) table() table {
	var t table
	t.add("SKU", v.SKU)
	t.add("DELIVERY", v.Delivery)
	t.add("QTY", v.Qty)
	t.add("TOTAL", v.Total)
	t.add("POOL", v.Pool)
	t.add("REVISION", v.Revision)
	t.add("REPLAYED", v.Replayed)
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
	if err := requireFlags(c, "delivery", "qty"); err != nil {
		return err
	}
	delivery, qty := c.String("delivery"), c.Int64("qty")
	if err := asciiOnly("--delivery", delivery); err != nil {
		return err
	}
	if err := segments.ValidateDeliveryID(delivery); err != nil {
		return usageError("--delivery: %v", err)
	}
	if err := segments.ValidateQty(qty); err != nil {
		return usageError("--qty: %v", err)
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		r, err := cn.coord.Restock(ctx, sku, delivery, qty)
		if err != nil {
			return opFailed(ctx, err)
		}
		return show(c, g, restockView{SKU: r.SKU, Delivery: r.Delivery, Qty: r.Qty, Total: r.Total, Pool: r.Pool,
			Revision: r.Revision, Replayed: r.Replayed})
	})
}

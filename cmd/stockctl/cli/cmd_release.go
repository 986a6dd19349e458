package cli

import (
	"context"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

func releaseCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "release",
		Usage:     "return an order's stock to its SKU (idempotent)",
		ArgsUsage: "SKU --order ID",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "order", Usage: "the order ID given to allocate (required)"},
		},
		Action: releaseAction,
	}
}

// releaseView is the result of release.
type releaseView struct {
	SKU   string     `json:"sku"`
	Order string     `json:"order"`
	Qty   int64      `json:"qty"`
	Parts []partView `json:"parts"`
	// Released is false when the order had already been released: nothing
	// was returned now.
	Released bool  `json:"released"`
	Revision int64 `json:"revision"`
	// State is the order's reservation state, when it is one (omitted for
	// a plain allocation).
	State string `json:"state,omitempty"`
	Buyer string `json:"buyer,omitempty"`
}

func (v releaseView) table() table {
	var t table
	t.add("SKU", v.SKU)
	t.add("ORDER", v.Order)
	t.add("QTY", v.Qty)
	t.add("PARTS", partsText(v.Parts))
	t.add("RELEASED", v.Released)
	t.add("REVISION", v.Revision)
	if v.State != "" {
		t.add("STATE", v.State)
	}
	if v.Buyer != "" {
		t.add("BUYER", v.Buyer)
	}
	if !v.Released {
		t.notes = append(t.notes, "(already released earlier: nothing returned now)")
	}
	return t
}

func releaseAction(c *ucli.Context) error {
	g, sku, order, err := orderArgs(c)
	if err != nil {
		return err
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		r, err := cn.coord.Release(ctx, sku, order)
		if err != nil {
			return opFailed(ctx, err)
		}
		return show(c, g, releaseViewOf(r))
	})
}

// orderArgs reads what release, confirm and cancel take: the global
// flags, the SKU argument and --order, each checked (a usage error names
// what was wrong).
func orderArgs(c *ucli.Context) (*globals, string, string, error) {
	g, err := readGlobals(c)
	if err != nil {
		return g, "", "", err
	}
	sku, err := oneArg(c, "SKU", segments.ValidateSKU)
	if err != nil {
		return g, "", "", err
	}
	if err := requireFlags(c, "order"); err != nil {
		return g, "", "", err
	}
	order := c.String("order")
	if err := asciiOnly("--order", order); err != nil {
		return g, "", "", err
	}
	if err := segments.ValidateOrderID(order); err != nil {
		return g, "", "", usageError("--order: %v", err)
	}
	return g, sku, order, nil
}

func releaseViewOf(r *coordinator.Released) releaseView {
	return releaseView{SKU: r.SKU, Order: r.Order, Qty: r.Qty, Parts: partViews(r.Parts),
		Released: r.Released, Revision: r.Revision, State: string(r.State), Buyer: r.Buyer}
}

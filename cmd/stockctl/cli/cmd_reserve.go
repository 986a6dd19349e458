package cli

import (
	"context"
	"fmt"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/segments"
)

func reserveCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "reserve",
		Usage:     "take stock for an order that must be confirmed before its TTL runs out (idempotent by order ID)",
		ArgsUsage: "SKU --order ID --qty N --ttl D [--route-key KEY] [--buyer B] | --order ID --line SKU=QTY [--line ...] --ttl D [--buyer B]",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "order", Usage: "order ID, unique per SKU; retrying it is safe (required)"},
			&ucli.Int64Flag{Name: "qty", Usage: "units to take (required)"},
			&ucli.DurationFlag{Name: "ttl", Usage: fmt.Sprintf("how long the reservation waits for confirm, e.g. 15m; more than 0, at most %v (required)", segments.MaxReservationTTL)},
			&ucli.StringFlag{Name: "route-key", Usage: "routes the order to a segment (default: the buyer, else a random segment)"},
			buyerFlag(),
			lineFlag(),
		},
		Action: reserveAction,
	}
}

func reserveAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	if c.IsSet("line") {
		if err := requireFlags(c, "ttl"); err != nil {
			return err
		}
		ttl := c.Duration("ttl")
		if err := segments.ValidateTTL(ttl); err != nil {
			return usageError("--ttl: %v", err)
		}
		return linesAction(c, g, ttl)
	}
	sku, err := oneArg(c, "SKU", segments.ValidateSKU)
	if err != nil {
		return err
	}
	if err := requireFlags(c, "order", "qty", "ttl"); err != nil {
		return err
	}
	order, qty, route, buyer, err := readOrderFlags(c)
	if err != nil {
		return err
	}
	ttl := c.Duration("ttl")
	if err := segments.ValidateTTL(ttl); err != nil {
		return usageError("--ttl: %v", err)
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		a, err := cn.coord.Reserve(ctx, sku, order, qty, route, ttl, buyerOpts(buyer)...)
		if err != nil {
			return opFailed(ctx, err)
		}
		if err := show(c, g, allocationViewOf(a)); err != nil {
			return err
		}
		if a.State == segments.StateExpired {
			// A retry that finds its reservation expired: scripts must not
			// read it as stock held.
			return ucli.Exit(fmt.Sprintf("stockctl: reservation %q of %s expired at %s", order, sku, a.Deadline.UTC().Format(time.RFC3339Nano)), ExitExpired)
		}
		return nil
	})
}

func confirmCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "confirm",
		Usage:     "make a reservation a final allocation (idempotent); exit 7 if it expired",
		ArgsUsage: "SKU --order ID",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "order", Usage: "the order ID given to reserve (required)"},
		},
		Action: confirmAction,
	}
}

// confirmView is the result of confirm.
type confirmView struct {
	SKU      string     `json:"sku"`
	Order    string     `json:"order"`
	Qty      int64      `json:"qty"`
	Parts    []partView `json:"parts"`
	Buyer    string     `json:"buyer,omitempty"`
	Deadline time.Time  `json:"deadline"`
	Revision int64      `json:"revision"`
	// Replayed: the reservation had been confirmed before; nothing changed.
	Replayed bool `json:"replayed"`
}

func (v confirmView) table() table {
	var t table
	t.add("SKU", v.SKU)
	t.add("ORDER", v.Order)
	t.add("QTY", v.Qty)
	t.add("PARTS", partsText(v.Parts))
	if v.Buyer != "" {
		t.add("BUYER", v.Buyer)
	}
	t.add("DEADLINE", v.Deadline.Format(time.RFC3339Nano))
	t.add("REVISION", v.Revision)
	t.add("REPLAYED", v.Replayed)
	return t
}

func confirmAction(c *ucli.Context) error {
	g, sku, order, err := orderArgs(c)
	if err != nil {
		return err
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		r, err := cn.coord.Confirm(ctx, sku, order)
		if err != nil {
			return opFailed(ctx, err)
		}
		return show(c, g, confirmView{SKU: r.SKU, Order: r.Order, Qty: r.Qty, Parts: partViews(r.Parts), Buyer: r.Buyer,
			Deadline: r.Deadline.UTC(), Revision: r.Revision, Replayed: r.Replayed})
	})
}

func cancelCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "cancel",
		Usage:     "give a live reservation's stock back (idempotent); exit 5 if it was confirmed, 7 if it expired",
		ArgsUsage: "SKU --order ID",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "order", Usage: "the order ID given to reserve (required)"},
		},
		Action: cancelAction,
	}
}

func cancelAction(c *ucli.Context) error {
	g, sku, order, err := orderArgs(c)
	if err != nil {
		return err
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		r, err := cn.coord.Cancel(ctx, sku, order)
		if err != nil {
			return opFailed(ctx, err)
		}
		return show(c, g, releaseViewOf(r))
	})
}

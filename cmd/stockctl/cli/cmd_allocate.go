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

func allocateCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "allocate",
		Usage:     "take stock of a SKU for an order (idempotent by order ID)",
		ArgsUsage: "SKU --order ID --qty N [--route-key KEY] [--buyer B] | --order ID --line SKU=QTY [--line SKU=QTY ...] [--buyer B]",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "order", Usage: "order ID, unique per SKU; retrying it is safe (required)"},
			&ucli.Int64Flag{Name: "qty", Usage: "units to take (required)"},
			&ucli.StringFlag{Name: "route-key", Usage: "routes the order to a segment, e.g. a user ID (default: the buyer, else a random segment)"},
			buyerFlag(),
			lineFlag(),
		},
		Action: allocateAction,
	}
}

// partView is where part of an order's stock came from: "pool" or "seg/3".
type partView struct {
	From string `json:"from"`
	Qty  int64  `json:"qty"`
}

func partViews(parts []segments.Part) []partView {
	out := make([]partView, 0, len(parts))
	for _, p := range parts {
		out = append(out, partView{From: p.Place.String(), Qty: p.Qty})
	}
	return out
}

func partsText(parts []partView) string {
	s := make([]string, len(parts))
	for i, p := range parts {
		s[i] = fmt.Sprintf("%d from %s", p.Qty, p.From)
	}
	return strings.Join(s, ", ")
}

// allocationView is the result of allocate.
type allocationView struct {
	SKU      string     `json:"sku"`
	Order    string     `json:"order"`
	Qty      int64      `json:"qty"`
	Parts    []partView `json:"parts"`
	Revision int64      `json:"revision"`
	// Replayed: the order ID had already been applied; nothing was taken
	// now and the fields describe the first application.
	Replayed bool `json:"replayed"`
	// Released: the (replayed) order has since been released.
	Released bool `json:"released"`
	// Buyer, State and Deadline: see reserve (omitted when empty).
	Buyer    string     `json:"buyer,omitempty"`
	State    string     `json:"state,omitempty"`
	Deadline *time.Time `json:"deadline,omitempty"`
}

func (v allocationView) table() table {
	var t table
	t.add("SKU", v.SKU)
	t.add("ORDER", v.Order)
	t.add("QTY", v.Qty)
	t.add("PARTS", partsText(v.Parts))
	t.add("REVISION", v.Revision)
	t.add("REPLAYED", v.Replayed)
	if v.Released {
		t.add("RELEASED", v.Released)
	}
	if v.Buyer != "" {
		t.add("BUYER", v.Buyer)
	}
	if v.State != "" {
		t.add("STATE", v.State)
	}
	if v.Deadline != nil {
		t.add("DEADLINE", v.Deadline.Format(time.RFC3339Nano))
	}
	return t
}

func allocateAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	if c.IsSet("line") {
		return linesAction(c, g, 0)
	}
	sku, err := oneArg(c, "SKU", segments.ValidateSKU)
	if err != nil {
		return err
	}
	if err := requireFlags(c, "order", "qty"); err != nil {
		return err
	}
	order, qty, route, buyer, err := readOrderFlags(c)
	if err != nil {
		return err
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		a, err := cn.coord.Allocate(ctx, sku, order, qty, route, buyerOpts(buyer)...)
		if err != nil {
			return opFailed(ctx, err)
		}
		return show(c, g, allocationViewOf(a))
	})
}

func allocationViewOf(a *coordinator.Allocation) allocationView {
	v := allocationView{SKU: a.SKU, Order: a.Order, Qty: a.Qty, Parts: partViews(a.Parts),
		Revision: a.Revision, Replayed: a.Replayed, Released: a.Released, Buyer: a.Buyer, State: string(a.State)}
	if !a.Deadline.IsZero() {
		d := a.Deadline.UTC()
		v.Deadline = &d
	}
	return v
}

func buyerFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "buyer", Usage: "who the order is for; required on a SKU with a per-user limit, which it counts against"}
}

// readOrderFlags reads and checks the flags allocate and reserve share:
// --order, --qty, --route-key and --buyer (the route key defaults to the
// buyer). Every problem is a usage error naming the flag.
func readOrderFlags(c *ucli.Context) (order string, qty int64, route, buyer string, err error) {
	order, qty, route, buyer = c.String("order"), c.Int64("qty"), c.String("route-key"), c.String("buyer")
	if err := asciiOnly("--order", order); err != nil {
		return "", 0, "", "", err
	}
	if err := validateBuyerFlag(buyer); err != nil {
		return "", 0, "", "", err
	}
	if route == "" {
		route = buyer
	}
	if err := segments.ValidateOrderID(order); err != nil {
		return "", 0, "", "", usageError("--order: %v", err)
	}
	if err := segments.ValidateQty(qty); err != nil {
		return "", 0, "", "", usageError("--qty: %v", err)
	}
	if err := segments.ValidateRouteKey(route); err != nil {
		return "", 0, "", "", usageError("--route-key: %v", err)
	}
	return order, qty, route, buyer, nil
}

func validateBuyerFlag(buyer string) error {
	if buyer == "" {
		return nil
	}
	if err := asciiOnly("--buyer", buyer); err != nil {
		return err
	}
	if err := segments.ValidateBuyer(buyer); err != nil {
		return usageError("--buyer: %v", err)
	}
	return nil
}

func buyerOpts(buyer string) []coordinator.OrderOption {
	if buyer == "" {
		return nil
	}
	return []coordinator.OrderOption{coordinator.WithBuyer(buyer)}
}

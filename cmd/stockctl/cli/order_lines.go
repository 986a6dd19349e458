package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

// Orders of several SKUs: allocate and reserve with --line SKU=QTY
// (repeated) instead of a SKU argument and --qty. Every line is taken, or
// none (coordinator.AllocateOrder).

func lineFlag() ucli.Flag {
	return &ucli.StringSliceFlag{Name: "line", Usage: "SKU=QTY, a line of an order of several SKUs, all taken or none; " +
		"repeat it (or separate lines with commas), and give no SKU argument, --qty or --route-key"}
}

// readLines reads --line flags, and checks that the single-SKU form's
// argument and flags are not mixed in.
func readLines(c *ucli.Context) ([]coordinator.Line, error) {
	if c.NArg() > 0 {
		return nil, usageError("--line takes the place of the SKU argument %q: give every SKU as a --line", c.Args().First())
	}
	for _, f := range []string{"qty", "route-key"} {
		if c.IsSet(f) {
			return nil, usageError("--%s is for an order of one SKU; with --line each line has its quantity", f)
		}
	}
	var lines []coordinator.Line
	for _, l := range c.StringSlice("line") {
		if err := asciiOnly("--line", l); err != nil {
			return nil, err
		}
		sku, qty, ok := strings.Cut(l, "=")
		if !ok {
			return nil, usageError("--line %q: want SKU=QTY", l)
		}
		n, err := strconv.ParseInt(qty, 10, 64)
		if err != nil {
			return nil, usageError("--line %q: quantity %q is not a whole number", l, qty)
		}
		lines = append(lines, coordinator.Line{SKU: sku, Qty: n})
	}
	if err := segments.ValidateLines(lines); err != nil {
		return nil, usageError("--line: %v", err)
	}
	return lines, nil
}

// orderView is the result of allocate and reserve with --line.
type orderView struct {
	Order string `json:"order"`
	// Lines are the lines' allocations, in the order given.
	Lines    []allocationView `json:"lines"`
	Revision int64            `json:"revision"`
	Replayed bool             `json:"replayed"`
	Released bool             `json:"released"`
	Buyer    string           `json:"buyer,omitempty"`
	State    string           `json:"state,omitempty"`
	Deadline *time.Time       `json:"deadline,omitempty"`
}

func (v orderView) table() table {
	var t table
	t.add("ORDER", v.Order)
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
	t.header = []string{"SKU", "QTY", "PARTS"}
	for _, l := range v.Lines {
		t.rows = append(t.rows, []string{l.SKU, strconv.FormatInt(l.Qty, 10), partsText(l.Parts)})
	}
	return t
}

func orderViewOf(a *coordinator.OrderAllocation) orderView {
	v := orderView{Order: a.Order, Revision: a.Revision, Replayed: a.Replayed, Released: a.Released,
		Buyer: a.Buyer, State: string(a.State)}
	for _, l := range a.Lines {
		v.Lines = append(v.Lines, allocationViewOf(l))
	}
	if !a.Deadline.IsZero() {
		d := a.Deadline.UTC()
		v.Deadline = &d
	}
	return v
}

// linesAction is allocate (ttl 0) or reserve with --line.
func linesAction(c *ucli.Context, g *globals, ttl time.Duration) error {
	lines, err := readLines(c)
	if err != nil {
		return err
	}
	if err := requireFlags(c, "order"); err != nil {
		return err
	}
	order, buyer := c.String("order"), c.String("buyer")
	if err := asciiOnly("--order", order); err != nil {
		return err
	}
	if err := segments.ValidateOrderID(order); err != nil {
		return usageError("--order: %v", err)
	}
	if err := validateBuyerFlag(buyer); err != nil {
		return err
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		var a *coordinator.OrderAllocation
		var err error
		if ttl > 0 {
			a, err = cn.coord.ReserveOrder(ctx, order, lines, ttl, buyerOpts(buyer)...)
		} else {
			a, err = cn.coord.AllocateOrder(ctx, order, lines, buyerOpts(buyer)...)
		}
		if err != nil {
			return opFailed(ctx, err)
		}
		if err := show(c, g, orderViewOf(a)); err != nil {
			return err
		}
		if a.State == segments.StateExpired {
			return ucli.Exit(fmt.Sprintf("stockctl: reservation %q expired at %s", order, a.Deadline.UTC().Format(time.RFC3339Nano)), ExitExpired)
		}
		return nil
	})
}

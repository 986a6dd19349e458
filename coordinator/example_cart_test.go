package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
)

// A cart of two SKUs, taken all or nothing; a cart whose second line is
// sold out takes nothing and says which line; the first cart released
// whole.
func ExampleCoordinator_AllocateOrder() {
	client, err := clientv3.New(clientv3.Config{Endpoints: etcd(), DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	c, err := coordinator.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	for sku, total := range map[string]int64{"phone": 10, "case": 1} {
		if _, err := c.CreateSKU(ctx, sku, coordinator.SKUConfig{Total: total, Segments: 2}); err != nil {
			log.Fatal(err)
		}
	}
	a, err := c.AllocateOrder(ctx, "cart-1", []coordinator.Line{{SKU: "phone", Qty: 1}, {SKU: "case", Qty: 1}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("cart-1:", a.Lines[0].SKU, a.Lines[0].Qty, "+", a.Lines[1].SKU, a.Lines[1].Qty,
		"at one revision:", a.Lines[0].Revision == a.Lines[1].Revision)

	_, err = c.AllocateOrder(ctx, "cart-2", []coordinator.Line{{SKU: "phone", Qty: 1}, {SKU: "case", Qty: 1}})
	var line *coordinator.LineError
	if errors.As(err, &line) && errors.Is(err, coordinator.ErrInsufficientStock) {
		fmt.Println("cart-2 refused for line", line.Index, line.SKU)
	}

	// Any line's SKU finds the whole order.
	r, err := c.ReleaseOrder(ctx, "case", "cart-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("released lines:", len(r.Lines))
	// Output:
	// cart-1: phone 1 + case 1 at one revision: true
	// cart-2 refused for line 1 case
	// released lines: 2
}

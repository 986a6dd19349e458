package rebalance_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/rebalance"
)

// etcd() stands for your etcd cluster's endpoints (example_etcd_test.go
// starts a fresh embedded etcd for each example).

// The rebalancer in a service: every process runs one, one of them is
// elected, and it refills segments from the pool as they run low. Here a
// SKU starts with everything in its pool, and the elected rebalancer hands
// each segment a refill batch.
func ExampleRebalancer_Run() {
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	if _, err := c.CreateSKU(ctx, "iphone", coordinator.SKUConfig{Total: 100, Segments: 4, InitialFill: 0,
		LowWatermark: 5, RefillBatch: 10}); err != nil {
		log.Fatal(err)
	}
	moves := make(chan rebalance.Move, 16)
	r, err := rebalance.New(c, rebalance.Config{Identity: "shop-1", OnMove: func(m rebalance.Move) { moves <- m }})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }() // until ctx ends; it resigns then

	moved := 0
	for range 4 {
		m := <-moves
		moved += int(m.Qty)
	}
	cancel()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	st, err := c.Status(context.Background(), "iphone")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("refilled", moved, "units; pool", st.Pool)
	// Output: refilled 40 units; pool 60
}

// One pass now, as `stockctl rebalance SKU` makes: campaign, move, record
// the pass where status shows it, resign.
func ExampleRebalancer_RunOnce() {
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

	if _, err := c.CreateSKU(ctx, "tee", coordinator.SKUConfig{Total: 30, Segments: 3, InitialFill: 0, RefillBatch: 4}); err != nil {
		log.Fatal(err)
	}
	r, err := rebalance.New(c, rebalance.Config{Identity: "ops"})
	if err != nil {
		log.Fatal(err)
	}
	pass, err := r.RunOnce(ctx, "tee")
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range pass.Moves {
		fmt.Println(m.Kind, m.Qty, "units into segment", m.Segment)
	}
	// Unordered output:
	// refill 4 units into segment 0
	// refill 4 units into segment 1
	// refill 4 units into segment 2
}

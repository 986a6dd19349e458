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

// The examples below are whole programs but for one thing: etcd() stands
// for your etcd cluster's endpoints, e.g. []string{"https://etcd-1:2379"}
// (with TLS and a user in the clientv3.Config). Here each example gets a
// fresh embedded etcd (example_etcd_test.go).

// A lock whose protected write commits only while the lock is held.
func ExampleCoordinator_Lock() {
	client, err := clientv3.New(clientv3.Config{Endpoints: etcd(), DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	c, err := coordinator.New(client) // one per process: it owns the process's etcd session
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	l, err := c.Lock(ctx, "invoice-42")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Unlock(ctx)
	// The write carries the lock's fence: etcd applies it only while the
	// lock is really held, however late this process runs.
	resp, err := l.Txn(ctx).Then(clientv3.OpPut("/app/invoice-42", "paid")).Commit()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("written while held:", resp.Succeeded)
	// Output: written while held: true
}

// A flash sale in miniature: a SKU of 10 units in 2 segments.
func ExampleCoordinator_Allocate() {
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

	if _, err := c.CreateSKU(ctx, "iphone", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10}); err != nil {
		log.Fatal(err)
	}
	a, err := c.Allocate(ctx, "iphone", "order-1", 3, "user-7")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("allocated", a.Qty, "replayed:", a.Replayed)

	again, err := c.Allocate(ctx, "iphone", "order-1", 3, "user-7") // a retry
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retry replayed:", again.Replayed, "same revision:", again.Revision == a.Revision)

	_, err = c.Allocate(ctx, "iphone", "order-2", 8, "user-8")
	fmt.Println("sold out:", errors.Is(err, coordinator.ErrInsufficientStock))
	var refused *coordinator.InsufficientStockError
	if errors.As(err, &refused) { // true at one revision, which it names
		fmt.Println("wanted", refused.Want, "of the", refused.Remaining, "left")
	}

	st, err := c.Status(ctx, "iphone")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("remaining", st.Remaining(), "allocated", st.Allocated)
	// Output:
	// allocated 3 replayed: false
	// retry replayed: true same revision: true
	// sold out: true
	// wanted 8 of the 7 left
	// remaining 7 allocated 3
}

// A selling service's coordinator announces itself at start
// (WithSellerSeat), so that SKUs created while it runs are born with a
// segment it sells from lazily: its first order of each writes only the
// order's record, as later ones do, with no Prepare.
func ExampleWithSellerSeat() {
	client, err := clientv3.New(clientv3.Config{Endpoints: etcd(), DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	c, err := coordinator.New(client, coordinator.WithSellerSeat())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.CreateSKU(ctx, "mug", coordinator.SKUConfig{Total: 100, Segments: 4, InitialFill: 100}); err != nil {
		log.Fatal(err)
	}
	a, err := c.Allocate(ctx, "mug", "order-1", 2, "")
	if err != nil {
		log.Fatal(err)
	}
	st, err := c.Status(ctx, "mug")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("allocated", a.Qty, "remaining", st.Remaining())
	// Output:
	// allocated 2 remaining 98
}

// A sale of many SKUs that opens at a set time: each process prepares for
// them shortly before, so that its first order of each SKU writes only
// its record (without Prepare it also writes the SKU's counter, and
// reads first).
func ExampleCoordinator_Prepare() {
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

	skus := []string{"tee-s", "tee-m", "tee-l"}
	for _, sku := range skus {
		if _, err := c.CreateSKU(ctx, sku, coordinator.SKUConfig{Total: 100, Segments: 4, InitialFill: 100}); err != nil {
			log.Fatal(err)
		}
	}
	// Seconds before the sale opens (what it prepares is kept while in
	// use, and for 20 s of idleness by default):
	p, err := c.Prepare(ctx, skus...)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("prepared", p.Ready, "of", p.SKUs, "SKUs, skipped", p.Skipped)

	_, err = c.Prepare(ctx, "tee-xl")
	fmt.Println("unknown SKU:", errors.Is(err, coordinator.ErrUnknownSKU))

	a, err := c.Allocate(ctx, "tee-m", "order-1", 1, "")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("allocated", a.Qty)
	// Output:
	// prepared 3 of 3 SKUs, skipped 0
	// unknown SKU: true
	// allocated 1
}

// A checkout: the units are held by a reservation until the payment
// confirms it; a buyer may hold at most 2 units of this SKU.
func ExampleCoordinator_Reserve() {
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
	if _, err := c.CreateSKU(ctx, "tee", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10, PerUserLimit: 2}); err != nil {
		log.Fatal(err)
	}
	r, err := c.Reserve(ctx, "tee", "order-1", 2, "", 15*time.Minute, coordinator.WithBuyer("amy"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("reserved:", r.Qty, r.State)

	// A third unit for amy is over her limit, whatever process asks.
	_, err = c.Reserve(ctx, "tee", "order-2", 1, "", 15*time.Minute, coordinator.WithBuyer("amy"))
	fmt.Println("limit:", errors.Is(err, coordinator.ErrLimitExceeded))

	// A buyer refused for want of stock can be told when units held by
	// unpaid reservations may come back: order-1's deadline.
	at, live, err := c.NextExpiry(ctx, "tee")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("may come back:", live, time.Until(at) > 14*time.Minute)

	// The payment arrived: final. (Unconfirmed, it would have expired after
	// 15 minutes and its units gone back.)
	if _, err := c.Confirm(ctx, "tee", "order-1"); err != nil {
		log.Fatal(err)
	}
	if _, live, err = c.NextExpiry(ctx, "tee"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("live reservations:", live)
	st, err := c.Status(ctx, "tee")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("allocated:", st.Allocated, "reserved:", st.Reserved)
	// Output:
	// reserved: 2 reserved
	// limit: true
	// may come back: true true
	// live reservations: false
	// allocated: 2 reserved: 0
}

// Archiving old orders, so that etcd does not fill up over a long sale:
// the books still balance, with the archived units counted.
func ExampleCoordinator_Prune() {
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

	if _, err := c.CreateSKU(ctx, "mug", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}); err != nil {
		log.Fatal(err)
	}
	for _, order := range []string{"m-1", "m-2"} {
		if _, err := c.Allocate(ctx, "mug", order, 2, ""); err != nil {
			log.Fatal(err)
		}
	}
	// In a service: time.Now().Add(-30 * 24 * time.Hour), older than any
	// retry or return of an order.
	p, err := c.Prune(ctx, "mug", time.Now())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pruned", p.Orders, "orders holding", p.Units, "units")
	a, err := c.Audit(ctx, "mug")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("balanced:", a.OK, "archived:", a.Archived, "records left:", a.Orders)
	// Output:
	// pruned 2 orders holding 4 units
	// balanced: true archived: 4 records left: 0
}

// A read-write lock: readers hold it together, a writer alone, and a
// reader that comes after a queued writer waits for it.
func ExampleCoordinator_RLock() {
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
	r1, err := c.RLock(ctx, "catalog")
	if err != nil {
		log.Fatal(err)
	}
	r2, err := c.RLock(ctx, "catalog") // another reader: at once
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Lock(ctx, "catalog", coordinator.TryFor(0)) // a writer: busy while readers hold
	fmt.Println("writer while reading:", err != nil && errors.Is(err, coordinator.ErrLocked))
	fmt.Println("each reader has its own token:", r1.Token() != r2.Token())
	_ = r1.Unlock(ctx)
	_ = r2.Unlock(ctx)
	w, err := c.Lock(ctx, "catalog")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("the writer's token is larger:", w.Token() > r2.Token())
	_ = w.Unlock(ctx)
	// Output:
	// writer while reading: true
	// each reader has its own token: true
	// the writer's token is larger: true
}

// A semaphore of 2: a third permit waits; its limit is stored with it.
func ExampleCoordinator_AcquirePermit() {
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
	for range 2 {
		p, err := c.AcquirePermit(ctx, "db-backfill", 2)
		if err != nil {
			log.Fatal(err)
		}
		defer p.Unlock(ctx)
	}
	_, err = c.AcquirePermit(ctx, "db-backfill", 2, coordinator.TryFor(100*time.Millisecond))
	fmt.Println("a third permit of 2:", errors.Is(err, coordinator.ErrLocked))
	_, err = c.AcquirePermit(ctx, "db-backfill", 5, coordinator.TryFor(0))
	var mismatch *coordinator.LimitMismatchError
	fmt.Println("another limit:", errors.As(err, &mismatch), mismatch.Have)
	// Output:
	// a third permit of 2: true
	// another limit: true 2
}

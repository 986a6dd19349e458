package feed_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/embedetcd"
)

// exampleEtcd starts an embedded etcd for an example; a service would
// connect to its own cluster instead.
func exampleEtcd() (*clientv3.Client, func()) {
	dir, err := os.MkdirTemp("", "stockctl-feed-example-")
	if err != nil {
		log.Fatal(err)
	}
	s, err := embedetcd.Start(context.Background(), embedetcd.Config{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		log.Fatal(err)
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	return client, func() {
		client.Close()
		s.Close()
		os.RemoveAll(dir)
	}
}

// Applying a sale's orders: every change so far, then a resume from the
// stored cursor that sees only what came after.
func ExampleOpen() {
	client, stop := exampleEtcd()
	defer stop()
	ctx := context.Background()
	c, err := coordinator.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateSKU(ctx, "tee", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}); err != nil {
		log.Fatal(err)
	}
	c.Allocate(ctx, "tee", "o-1", 2, "amy")
	c.Reserve(ctx, "tee", "o-2", 1, "bob", 15*time.Minute, coordinator.WithBuyer("bob"))
	c.Cancel(ctx, "tee", "o-2")

	// apply stands for one database transaction: upsert the events by order
	// ID, store the cursor.
	var cursor int64
	apply := func(b feed.Batch) {
		for _, e := range b.Events {
			fmt.Printf("%s %s qty=%d buyer=%q\n", e.Kind, e.Order, e.Qty, e.Buyer)
		}
		cursor = b.Cursor
	}
	catchUp := func() {
		f, err := feed.Open(ctx, client, feed.Config{SKU: "tee", Since: cursor, UntilOpen: true})
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		for {
			b, err := f.Next(ctx)
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				log.Fatal(err) // a *feed.CompactedError: start again from feed.Snapshot
			}
			apply(b)
		}
	}
	catchUp()
	c.Release(ctx, "tee", "o-1")
	fmt.Println("-- resumed")
	catchUp()
	// Output:
	// allocated o-1 qty=2 buyer=""
	// reserved o-2 qty=1 buyer="bob"
	// cancelled o-2 qty=1 buyer="bob"
	// -- resumed
	// released o-1 qty=2 buyer=""
}

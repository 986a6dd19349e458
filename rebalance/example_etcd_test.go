package rebalance_test

import (
	"context"
	"log"
	"os"
	"sync"

	"github.com/stockctl/stockctl/internal/embedetcd"
)

// exampleServers are the embedded etcds etcd() started, stopped by TestMain.
var exampleServers struct {
	sync.Mutex
	stops []func()
}

// etcd stands for the endpoints of your etcd cluster in the examples: it
// starts a fresh embedded etcd, so that every example (and every -count
// round) begins with an empty one.
func etcd() []string {
	dir, err := os.MkdirTemp("", "stockctl-example-")
	if err != nil {
		log.Fatal(err)
	}
	s, err := embedetcd.Start(context.Background(), embedetcd.Config{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		log.Fatal(err)
	}
	exampleServers.Lock()
	exampleServers.stops = append(exampleServers.stops, func() { s.Close(); os.RemoveAll(dir) })
	exampleServers.Unlock()
	return s.Endpoints()
}

func stopExampleServers() {
	exampleServers.Lock()
	defer exampleServers.Unlock()
	for _, stop := range exampleServers.stops {
		stop()
	}
	exampleServers.stops = nil
}

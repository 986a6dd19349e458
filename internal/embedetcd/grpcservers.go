package embedetcd

import (
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// grpcServers collects the client gRPC servers etcd creates. etcd creates
// them in its serving goroutines, so add can run concurrently with stop.
type grpcServers struct {
	mu      sync.Mutex
	servers []*grpc.Server
	stopped bool
}

func (g *grpcServers) add(gs *grpc.Server) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		// Created after Close began (a very early Close): it has nothing to
		// drain, and stopping it before it serves just makes Serve return.
		gs.Stop()
		return
	}
	g.servers = append(g.servers, gs)
}

// stop gracefully stops the servers, giving requests in flight up to grace to
// finish, and then cuts whatever is left, typically watch streams. Cut
// clients see "unavailable" and reconnect (resuming their watches) to
// another member or to this one once it is back. embed.Etcd.Close then finds
// the servers already stopped.
func (g *grpcServers) stop(grace time.Duration) {
	g.mu.Lock()
	g.stopped = true
	servers := slices.Clone(g.servers)
	g.mu.Unlock()
	if len(servers) == 0 {
		return
	}
	var wg sync.WaitGroup
	for _, gs := range servers {
		wg.Go(gs.GracefulStop)
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		for _, gs := range servers {
			gs.Stop() // also makes the pending GracefulStop calls return
		}
		<-done
	}
}

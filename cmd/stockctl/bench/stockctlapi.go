package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/keys"
)

// NameStockctlAPI is StockctlAPI's name.
const NameStockctlAPI = "stockctl-api"

// StockctlAPI is stockctl-nostep through the network API: each of the
// run's processes is a real `stockctl serve --endpoints <the bench's etcd>`
// OS process (the API and a rebalancer candidate, as deployed), and the
// buyers of a process send their orders (Allocate, one unit, no step) over
// gRPC on pipeStreams OrderStream streams to its server, as a busy caller
// does, each waiting for its own answer. Beside stockctl-nostep in one run,
// it says what the API costs (Targets compares the two).
func StockctlAPI(s Serve) Spec {
	return Spec{Name: NameStockctlAPI, Title: "stockctl Allocate through N `stockctl serve` processes, gRPC clients",
		New: func() Strategy { return &stockctlAPI{serve: s} }}
}

type stockctlAPI struct {
	serve   Serve
	p       Params
	procs   []*serveProcess // one per process
	tr      []*http.Transport
	clients []stockctlv1connect.StockServiceClient
	pipes   [][]*orderPipe // per process, pipeStreams each
	cancel  context.CancelFunc
	refills *RefillObserver
	stopped []error // what stopping each process said, in Verify
	once    sync.Once
}

func (s *stockctlAPI) Setup(ctx context.Context, p Params) error {
	s.p = p
	if p.Step != nil {
		return errors.New("stockctl-api has no business step: the API's Allocate takes none")
	}
	// The processes start side by side: each costs a process start, an
	// etcd session and an election campaign.
	s.procs = make([]*serveProcess, p.Processes)
	errs := make([]error, p.Processes)
	var wg sync.WaitGroup
	for i := range p.Processes {
		wg.Go(func() {
			s.procs[i], errs[i] = startServe(ctx, s.serve, p.Etcd[0].Endpoints(), p.Prefix, fmt.Sprintf("bench-serve-%d", i))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, proc := range s.procs {
		// One HTTP/2 connection per process, as a gRPC client has: the
		// buyers' calls are streams on it.
		var h2c http.Protocols
		h2c.SetUnencryptedHTTP2(true)
		tr := &http.Transport{Protocols: &h2c}
		s.tr = append(s.tr, tr)
		s.clients = append(s.clients, stockctlv1connect.NewStockServiceClient(&http.Client{Transport: tr}, proc.api, connect.WithGRPC()))
	}
	// The streams live as long as the run: Teardown ends them.
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	for _, c := range s.clients {
		var ps []*orderPipe
		for range pipeStreams {
			ps = append(ps, newOrderPipe(pctx, c))
		}
		s.pipes = append(s.pipes, ps)
	}
	cfg := skuConfig(p)
	if _, err := s.clients[0].CreateSKU(ctx, connect.NewRequest(&stockctlv1.CreateSKURequest{Sku: benchSKU, Total: cfg.Total,
		Segments: int32(cfg.Segments), InitialFill: cfg.InitialFill, LowWatermark: cfg.LowWatermark, RefillBatch: cfg.RefillBatch})); err != nil {
		return fmt.Errorf("create the SKU through the API: %w", err)
	}
	var err error
	if s.refills, err = ObserveRefills(ctx, p.Etcd[0], p.Prefix, benchSKU, p.Segments, cfg.LowWatermark); err != nil {
		return fmt.Errorf("observe refills: %w", err)
	}
	// As for stockctl: the run starts once a rebalancer leads (or after
	// leaderWait; the segments hold stock anyway).
	ks, err := keys.New(p.Prefix)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithTimeout(ctx, leaderWait)
	defer cancel()
	for lctx.Err() == nil {
		resp, err := p.Etcd[0].Get(lctx, ks.Election()+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err == nil && resp.Count > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return context.Cause(ctx)
}

// pipeStreams is how many OrderStream streams each process's buyers share.
const pipeStreams = 1

func (s *stockctlAPI) Buy(ctx context.Context, buyer int, order string, qty int64, routeKey string) (bool, error) {
	proc := s.p.Process(buyer)
	pipe := s.pipes[proc][buyer%pipeStreams]
	res, err := pipe.allocate(ctx, &stockctlv1.AllocateRequest{Sku: benchSKU, Order: order, Qty: qty, RouteKey: routeKey})
	if err != nil {
		return false, err
	}
	if oe := res.GetError(); oe != nil {
		err := orderError(oe)
		if soldOut(err) {
			return false, fmt.Errorf("%w: %w", coordinator.ErrInsufficientStock, err)
		}
		return false, err
	}
	return res.GetAllocated().GetReplayed(), nil
}

// ProcessCPU is the CPU time the serve processes have used.
func (s *stockctlAPI) ProcessCPU() time.Duration {
	var cpu time.Duration
	for _, proc := range s.procs {
		if proc != nil && proc.cmd.Process != nil {
			cpu += pidCPU(proc.cmd.Process.Pid)
		}
	}
	return cpu
}

// soldOut reports whether err is the API's INSUFFICIENT_STOCK refusal.
func soldOut(err error) bool {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition {
		return false
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if _, ok := v.(*stockctlv1.InsufficientStock); ok {
				return true
			}
		}
	}
	return false
}

// Refills is what the run's refill observer saw, up to Verify.
func (s *stockctlAPI) Refills() RefillResult {
	if s.refills == nil {
		return RefillResult{Err: errors.New("not observed")}
	}
	return s.refills.Stop()
}

// Verify stops the serve processes gracefully (SIGTERM: what a deploy
// does), then reads the books from etcd with a coordinator of its own:
// they must balance after the stops too.
func (s *stockctlAPI) Verify(ctx context.Context) (Books, error) {
	if s.refills != nil {
		s.refills.Stop()
	}
	s.stopAll()
	c, err := coordinator.New(s.p.Etcd[0], coordinator.WithPrefix(s.p.Prefix))
	if err != nil {
		return Books{}, err
	}
	defer c.Close()
	a, err := c.Audit(ctx, benchSKU)
	if err != nil {
		return Books{}, err
	}
	b := Books{Stock: a.Total, Remaining: a.Pool + a.Segments, Sold: a.Allocated, Orders: a.Orders, Problems: a.Problems}
	for i, proc := range s.procs {
		if err := s.stopped[i]; err != nil {
			b.Problems = append(b.Problems, fmt.Sprintf("serve %d: %v", i, err))
		}
		if w := proc.warnings(); len(w) > 0 {
			b.Problems = append(b.Problems, fmt.Sprintf("serve %d: %d warnings (first: %s)", i, len(w), w[0]))
		}
	}
	if !a.OK && len(b.Problems) == 0 {
		b.Problems = []string{"the audit failed"}
	}
	return b, nil
}

// stopAll stops every serve process (once), side by side.
func (s *stockctlAPI) stopAll() {
	s.once.Do(func() {
		// The streams end first (each answers its orders in flight),
		// so that no serve process stops with a stream open.
		for _, ps := range s.pipes {
			for _, p := range ps {
				p.close()
			}
		}
		if s.cancel != nil {
			s.cancel()
		}
		for _, ps := range s.pipes {
			for _, p := range ps {
				p.wait()
			}
		}
		s.stopped = make([]error, len(s.procs))
		var wg sync.WaitGroup
		for i, proc := range s.procs {
			if proc != nil {
				wg.Go(func() { s.stopped[i] = proc.stop() })
			}
		}
		wg.Wait()
		for _, tr := range s.tr {
			tr.CloseIdleConnections()
		}
	})
}

func (s *stockctlAPI) Teardown(ctx context.Context) error {
	if s.refills != nil {
		s.refills.Stop()
	}
	s.stopAll()
	if len(s.p.Etcd) > 0 {
		return deletePrefix(ctx, s.p.Etcd[0], s.p.Prefix)
	}
	return nil
}

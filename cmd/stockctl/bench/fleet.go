package bench

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/rebalance"
)

// fleet is what the stockctl strategies of the lock and the sale shapes
// share: a coordinator per process, and the rebalancer on a coordinator of
// its own (on process 0's client).
type fleet struct {
	coords []*coordinator.Coordinator // one per process
	reb    *coordinator.Coordinator   // the rebalancer's, a process of its own
	stop   func()                     // stops the rebalancer; nil before it runs
	// rebFailures counts the rebalancer's warnings (failed moves): a run
	// whose refills fail is not the run it claims to be.
	rebFailures warnCounter
	// opts are the coordinators' options beyond the prefix.
	opts []coordinator.Option
}

// open makes the coordinators, one per client of etcd, all under prefix.
func (f *fleet) open(etcd []*clientv3.Client, processes int, prefix string) error {
	for i := range processes {
		// Each process a service that sells (WithSellerSeat): its seat is
		// held before the run's SKUs are created, as a service's would be
		// before a sale's.
		c, err := coordinator.New(etcd[i], append([]coordinator.Option{coordinator.WithPrefix(prefix), coordinator.WithSellerSeat()}, f.opts...)...)
		if err != nil {
			return err
		}
		f.coords = append(f.coords, c)
	}
	reb, err := coordinator.New(etcd[0], append([]coordinator.Option{coordinator.WithPrefix(prefix)}, f.opts...)...)
	if err != nil {
		return err
	}
	f.reb = reb
	return nil
}

// startRebalancer runs the rebalancer until f.stop, beyond ctx.
func (f *fleet) startRebalancer(ctx context.Context) (*rebalance.Rebalancer, error) {
	r, err := rebalance.New(f.reb, rebalance.Config{Identity: "bench-rebalancer", Logger: slog.New(&f.rebFailures)})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(rctx) })
	var once sync.Once
	f.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	return r, nil
}

// close stops the rebalancer, closes every coordinator and deletes the
// run's keys under prefix.
func (f *fleet) close(ctx context.Context, etcd []*clientv3.Client, prefix string) error {
	if f.stop != nil {
		f.stop()
	}
	var errs []error
	for _, c := range append(f.coords, f.reb) {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	if len(etcd) > 0 {
		errs = append(errs, deletePrefix(ctx, etcd[0], prefix))
	}
	return errors.Join(errs...)
}

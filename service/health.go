package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
)

// healthChecker answers grpc.health.v1 for the whole server ("") and for
// each service: SERVING while the server is not shutting down and its etcd
// connection is up, else NOT_SERVING, so that a load balancer takes a
// server that cannot reach etcd (or is stopping) out of rotation.
type healthChecker struct{ s *Server }

func (h healthChecker) Check(_ context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	switch req.Service {
	case "", stockctlv1connect.StockServiceName, stockctlv1connect.LockServiceName:
	default:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("unknown service %q", req.Service))
	}
	if h.s.isClosing() || !h.s.etcdConnected() {
		return &grpchealth.CheckResponse{Status: grpchealth.StatusNotServing}, nil
	}
	return &grpchealth.CheckResponse{Status: grpchealth.StatusServing}, nil
}

// etcdConnected reports whether the coordinator's etcd connection is up
// (or idle, which the next call wakes).
//
// Over several clusters: whether any cluster's is (a cluster that is down
// fails only its own SKUs and locks, each call saying so).
func (s *Server) etcdConnected() bool {
	if names := s.c.Clusters(); names != nil {
		for _, n := range names {
			if connUp(s.c.Cluster(n).Client().ActiveConnection()) {
				return true
			}
		}
		return false
	}
	return connUp(s.c.Client().ActiveConnection())
}

// connUp reports whether conn is up or idle (nil: not known, so up).
func connUp(conn *grpc.ClientConn) bool {
	if conn == nil {
		return true
	}
	st := conn.GetState()
	return st == connectivity.Ready || st == connectivity.Idle
}

// etcdReady waits until the coordinator's etcd connection is ready, for at
// most Config.EtcdWait and at most half of what is left of ctx's deadline,
// so that a caller hears UNAVAILABLE (errEtcdUnavailable) in time rather
// than its own deadline. A connection that is up costs one atomic read.
//
// It is a gate at the start of a call, not a guarantee: etcd can go away
// during the call, which then ends with an etcd error or the deadline.
// Over several clusters there is no gate: a call's error names its
// cluster when that one is down (coordinator.ErrClusterUnavailable).
func (s *Server) etcdReady(ctx context.Context) error {
	if s.c.Clusters() != nil {
		return nil
	}
	return s.connReady(ctx, s.c.Client())
}

// clustersReady is etcdReady for a call that reads every cluster of
// several (ListSKUs): each cluster's connection is waited for at once, and
// one that stays down is a *coordinator.ClusterError naming it
// (ErrClusterUnavailable), where its read would wait for the caller's
// deadline.
func (s *Server) clustersReady(ctx context.Context) error {
	names := s.c.Clusters()
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			if err := s.connReady(ctx, s.c.Cluster(name).Client()); err != nil && ctx.Err() == nil {
				errs[i] = &coordinator.ClusterError{Cluster: name, Unavailable: true, Err: err}
			} else if err != nil {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// connReady waits for client's connection to be ready, as etcdReady says.
func (s *Server) connReady(ctx context.Context, client *clientv3.Client) error {
	conn := client.ActiveConnection()
	if conn == nil {
		return nil
	}
	st := conn.GetState()
	if st == connectivity.Ready {
		return nil
	}
	wait := s.cfg.EtcdWait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)/2)
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for st != connectivity.Ready {
		if st == connectivity.Idle {
			conn.Connect()
		}
		if st == connectivity.Shutdown || !conn.WaitForStateChange(wctx, st) {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return fmt.Errorf("%w: the connection stayed %s for %v", errEtcdUnavailable, st, wait.Round(time.Millisecond))
		}
		st = conn.GetState()
	}
	return nil
}

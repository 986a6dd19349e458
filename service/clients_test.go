package service_test

import (
	"net/http"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
)

// clients wraps a StockService client in one-line calls that return only
// the error, for tables of error cases.
type clients struct {
	t *testing.T
	c stockctlv1connect.StockServiceClient
}

func (c clients) allocate(sku, order string, qty int64, buyer string) error {
	_, err := c.c.Allocate(ctx(c.t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: sku, Order: order, Qty: qty, Buyer: buyer}))
	return err
}

func (c clients) reserve(sku, order string, qty int64, ttl *durationpb.Duration) error {
	_, err := c.c.Reserve(ctx(c.t), connect.NewRequest(&stockctlv1.ReserveRequest{Sku: sku, Order: order, Qty: qty, Ttl: ttl}))
	return err
}

func (c clients) confirm(sku, order string) error {
	_, err := c.c.Confirm(ctx(c.t), connect.NewRequest(&stockctlv1.ConfirmRequest{Sku: sku, Order: order}))
	return err
}

func (c clients) release(sku, order string) error {
	_, err := c.c.Release(ctx(c.t), connect.NewRequest(&stockctlv1.ReleaseRequest{Sku: sku, Order: order}))
	return err
}

func (c clients) create(sku string, total int64, segments int32) error {
	_, err := c.c.CreateSKU(ctx(c.t), connect.NewRequest(&stockctlv1.CreateSKURequest{Sku: sku, Total: total, Segments: segments}))
	return err
}

func (c clients) restock(sku string, qty int64, delivery string) error {
	_, err := c.c.Restock(ctx(c.t), connect.NewRequest(&stockctlv1.RestockRequest{Sku: sku, Qty: qty, Delivery: delivery}))
	return err
}

func (c clients) status(sku string) error {
	_, err := c.c.Status(ctx(c.t), connect.NewRequest(&stockctlv1.StatusRequest{Sku: sku}))
	return err
}

// statusRecorder remembers the HTTP status of the last response.
type statusRecorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	last int
}

func (s *statusRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := s.next.RoundTrip(r)
	if err == nil {
		s.mu.Lock()
		s.last = res.StatusCode
		s.mu.Unlock()
	}
	return res, err
}

// httpStatusOf runs call through Connect with JSON over HTTP/1.1 and
// returns the HTTP status of its response.
func httpStatusOf(t *testing.T, e *env, call func(clients) error) int {
	t.Helper()
	rec := &statusRecorder{next: httpClient(t, false, e.token()).Transport}
	c := stockctlv1connect.NewStockServiceClient(&http.Client{Transport: rec}, e.url, connect.WithProtoJSON())
	_ = call(clients{t: t, c: c})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.last
}

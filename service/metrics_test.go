package service_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/service"
)

// Every call is counted by method and code, those refused before a handler
// too, and the families are lint-clean.
func TestMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withToken())
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "m", Total: 2, Segments: 1, InitialFill: 2})
	_ = clients{t: t, c: c}.allocate("m", "o-1", 5, "") // sold out
	post(t, e, allocatePath, "application/json", "Bearer "+testToken, []byte(`{"sku":`))
	post(t, e, allocatePath, "application/json", "", []byte(`{}`))
	post(t, e, "/no.such.Service/Method", "application/json", "Bearer "+testToken, []byte(`{}`))
	s := openHold(t, e.grpcLocks(t), ctx(t), "m", durationpb.New(service.MaxLockTTL), nil)
	acquired(t, s)

	hist := map[[2]string]uint64{}
	fams, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	for _, m := range byName["stockctl_api_request_duration_seconds"].GetMetric() {
		var method, code string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "method":
				method = l.GetValue()
			case "code":
				code = l.GetValue()
			}
		}
		hist[[2]string{method, code}] += m.GetHistogram().GetSampleCount()
	}
	for _, want := range []struct {
		method, code string
	}{
		{"stockctl.v1.StockService/CreateSKU", "ok"},
		{"stockctl.v1.StockService/Allocate", "failed_precondition"},
		{"stockctl.v1.StockService/Allocate", "invalid_argument"}, // the body did not decode: no handler ran
		{"stockctl.v1.StockService/Allocate", "unauthenticated"},
		{"unknown", "unimplemented"},
	} {
		if hist[[2]string{want.method, want.code}] == 0 {
			t.Errorf("no call counted for method %q code %q; have %v", want.method, want.code, hist)
		}
	}
	if got := counter(t, e, "stockctl_api_rejected_total", "reason", "token_missing"); got != 1 {
		t.Errorf("rejected{token_missing} = %v, want 1", got)
	}
	gauge := func(family, label, value string) float64 {
		for _, m := range byName[family].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
		return -1
	}
	if got := gauge("stockctl_api_lock_holds", "shape", "stream"); got != 1 {
		t.Errorf("lock_holds{stream} = %v, want 1", got)
	}
	if got := gauge("stockctl_api_inflight_calls", "kind", "long"); got != 1 {
		t.Errorf("inflight_calls{long} = %v, want 1 (the Hold stream)", got)
	}
	problems, err := testutil.GatherAndLint(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

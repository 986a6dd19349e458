package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/coordinator"
)

// The library's sentinels that a real server reaches only under faults
// (compares that keep losing, corrupt values) map to the code and reason
// docs/api.md's table promises. The others are tested through the real
// server (stock_test.go, lockkinds_test.go).
func TestErrorsOfFaultsMapToTheirReasons(t *testing.T) {
	cases := []struct {
		name   string
		err    error
		code   connect.Code
		reason stockctlv1.ErrorReason
		retry  bool
	}{
		{"contention", fmt.Errorf("allocate: 40 commits refused by compares, nothing deducted: %w", coordinator.ErrContention),
			connect.CodeAborted, stockctlv1.ErrorReason_ERROR_REASON_CONTENTION, true},
		{"corrupt", fmt.Errorf("order o-1: %w", coordinator.ErrCorrupt),
			connect.CodeDataLoss, stockctlv1.ErrorReason_ERROR_REASON_DATA_CORRUPT, false},
		{"closed", coordinator.ErrClosed,
			connect.CodeUnavailable, stockctlv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN, false},
		{"session lost under a stock call", fmt.Errorf("restock: %w", coordinator.ErrSessionLost),
			connect.CodeUnavailable, stockctlv1.ErrorReason_ERROR_REASON_SESSION_LOST, true},
		{"one cluster of several unreachable", fmt.Errorf("allocate: %w", &coordinator.ClusterError{Cluster: "b", Unavailable: true, Err: context.DeadlineExceeded}),
			connect.CodeUnavailable, stockctlv1.ErrorReason_ERROR_REASON_ETCD_UNAVAILABLE, true},
		{"anything else", errors.New("something unexpected"),
			connect.CodeInternal, stockctlv1.ErrorReason_ERROR_REASON_INTERNAL, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ce := apiError(context.Background(), opOrder, tc.err)
			if ce.Code() != tc.code {
				t.Errorf("code %v, want %v", ce.Code(), tc.code)
			}
			var reason string
			retry := false
			for _, d := range ce.Details() {
				v, err := d.Value()
				if err != nil {
					t.Fatal(err)
				}
				switch v := v.(type) {
				case *errdetails.ErrorInfo:
					reason = v.Reason
				case *errdetails.RetryInfo:
					retry = true
				}
			}
			if want := tc.reason.String(); reason != want && "ERROR_REASON_"+reason != want {
				t.Errorf("reason %q, want %s", reason, want)
			}
			if retry != tc.retry {
				t.Errorf("RetryInfo given: %v, want %v", retry, tc.retry)
			}
			if !strings.Contains(ce.Message(), tc.err.Error()) {
				t.Errorf("message %q does not say %q", ce.Message(), tc.err)
			}
		})
	}
}

// A duration field past what a time.Duration holds is refused with the
// value the caller sent (issue 28, item 7: 315576000000s was echoed as
// 2562047h47m16.854775807s), and one in range with its bounds.
func TestDurationFieldEchoesWhatWasSent(t *testing.T) {
	for _, tc := range []struct {
		secs      int64
		want, not string
	}{
		{315576000000, "invalid ttl: 315576000000s is far too long", "2562047h"},
		{-315576000000, "invalid ttl: -315576000000s is far too long", "2562047h"},
		{3600, "invalid ttl: must be between 1s and 5m0s, got 1h0m0s", "far too long"},
	} {
		_, err := boundedDuration("ttl", &durationpb.Duration{Seconds: tc.secs}, time.Second, time.Second, 5*time.Minute)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.not) || !errors.Is(err, coordinator.ErrInvalidArgument) {
			t.Errorf("%ds: %v, want %q", tc.secs, err, tc.want)
		}
	}
}

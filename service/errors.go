package service

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo of every error.
const ErrorDomain = "stockctl"

// Errors of the service's own making, mapped by apiError like the
// coordinator's.
var (
	// errEtcdUnavailable ends a call whose etcd connection stayed down for
	// the etcd wait.
	errEtcdUnavailable = errors.New("etcd is unreachable")
	// errShuttingDown ends streams and refused calls while the server stops.
	errShuttingDown = errors.New("the server is shutting down")
)

// op says what kind of call an error came from, where the coordinator's
// sentinels mean different things to a caller (ErrConflict on a create is
// SKU_EXISTS, on an order ORDER_CONFLICT, on a reservation step
// ORDER_STATE_CONFLICT, on a restock DELIVERY_CONFLICT).
type op int

const (
	opRead   op = iota // Status, Audit, WatchStatus, WatchOrders
	opCreate           // CreateSKU
	opOrder            // Allocate, Reserve
	opStep             // Confirm, Cancel, Release
	opStock            // Restock
	opLock             // LockService
)

// reason returns an ErrorReason's string: its name without the prefix.
func reason(r stockctlv1.ErrorReason) string {
	return strings.TrimPrefix(r.String(), "ERROR_REASON_")
}

// newError builds the connect error of a reason, with an ErrorInfo (and its
// metadata) first and then the typed details.
func newError(code connect.Code, r stockctlv1.ErrorReason, err error, meta map[string]string, details ...proto.Message) *connect.Error {
	ce := connect.NewError(code, err)
	addDetail(ce, &errdetails.ErrorInfo{Reason: reason(r), Domain: ErrorDomain, Metadata: meta})
	for _, d := range details {
		addDetail(ce, d)
	}
	return ce
}

func addDetail(ce *connect.Error, m proto.Message) {
	if d, err := connect.NewErrorDetail(m); err == nil {
		ce.AddDetail(d)
	}
}

// apiError maps an error of the coordinator (or of the service) to the
// error a client sees. ctx is the call's: its end tells a deadline or a
// cancel of the caller apart from an etcd timeout.
func apiError(ctx context.Context, o op, err error) *connect.Error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	var lm *coordinator.LimitMismatchError
	if errors.As(err, &lm) { // before stockError: it matches ErrConflict too
		return newError(connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_LIMIT_MISMATCH, err,
			map[string]string{"name": lm.Name, "limit": itoa(int64(lm.Want)), "held_limit": itoa(int64(lm.Have))},
			&stockctlv1.LimitMismatch{Name: lm.Name, Limit: int32(lm.Want), HeldLimit: int32(lm.Have)})
	}
	if e := stockError(o, err); e != nil {
		addRefusedLine(e, err)
		return e
	}
	if e := lockError(o, err); e != nil {
		return e
	}
	switch {
	case errors.Is(err, coordinator.ErrClusterUnavailable):
		// One etcd cluster of several is down: its SKUs and locks only.
		var meta map[string]string
		if cl, ok := errors.AsType[*coordinator.ClusterError](err); ok {
			meta = map[string]string{"cluster": cl.Cluster}
		}
		return newError(connect.CodeUnavailable, stockctlv1.ErrorReason_ERROR_REASON_ETCD_UNAVAILABLE, err, meta, retryAfter(time.Second))
	case errors.Is(err, errEtcdUnavailable):
		return newError(connect.CodeUnavailable, stockctlv1.ErrorReason_ERROR_REASON_ETCD_UNAVAILABLE, err, nil, retryAfter(time.Second))
	case errors.Is(err, errShuttingDown), errors.Is(err, coordinator.ErrClosed):
		return newError(connect.CodeUnavailable, stockctlv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN, err, nil)
	case errors.Is(err, coordinator.ErrCorrupt):
		return newError(connect.CodeDataLoss, stockctlv1.ErrorReason_ERROR_REASON_DATA_CORRUPT, err, nil)
	case ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded):
		return newError(connect.CodeDeadlineExceeded, stockctlv1.ErrorReason_ERROR_REASON_DEADLINE_EXCEEDED, err, nil)
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		return newError(connect.CodeCanceled, stockctlv1.ErrorReason_ERROR_REASON_CANCELED, err, nil)
	case etcdUnavailable(err):
		return newError(connect.CodeUnavailable, stockctlv1.ErrorReason_ERROR_REASON_ETCD_UNAVAILABLE, err, nil, retryAfter(time.Second))
	}
	return newError(connect.CodeInternal, stockctlv1.ErrorReason_ERROR_REASON_INTERNAL, err, nil)
}

// stockError maps the stock sentinels; nil if err is none of them.
func stockError(o op, err error) *connect.Error {
	var (
		insufficient *coordinator.InsufficientStockError
		limit        *coordinator.LimitExceededError
		expired      *coordinator.ExpiredError
		pruned       *coordinator.OrderPrunedError
	)
	switch {
	case errors.Is(err, coordinator.ErrInvalidArgument):
		return invalidArgument(err)
	case errors.As(err, &insufficient):
		return newError(connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_INSUFFICIENT_STOCK, err,
			map[string]string{"sku": insufficient.SKU, "want": itoa(insufficient.Want), "remaining": itoa(insufficient.Remaining), "revision": itoa(insufficient.Revision)},
			&stockctlv1.InsufficientStock{Sku: insufficient.SKU, Want: insufficient.Want, Remaining: insufficient.Remaining, Revision: insufficient.Revision})
	case errors.As(err, &limit):
		return newError(connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_PER_USER_LIMIT_EXCEEDED, err,
			map[string]string{"sku": limit.SKU, "limit": itoa(limit.Limit), "held": itoa(limit.Held), "want": itoa(limit.Want)},
			&stockctlv1.PerUserLimitExceeded{Sku: limit.SKU, Buyer: limit.Buyer, Limit: limit.Limit, Held: limit.Held, Want: limit.Want, Revision: limit.Revision})
	case errors.As(err, &expired):
		return newError(connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_RESERVATION_EXPIRED, err,
			map[string]string{"sku": expired.SKU, "order": expired.Order, "deadline": expired.Deadline.UTC().Format(time.RFC3339Nano)},
			&stockctlv1.ReservationExpired{Sku: expired.SKU, Order: expired.Order, Deadline: timestamp(expired.Deadline), Revision: expired.Revision})
	case errors.Is(err, coordinator.ErrUnknownSKU):
		return newError(connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_SKU_NOT_FOUND, err, nil)
	case errors.As(err, &pruned):
		// Before ErrOrderNotFound, which it also matches.
		return newError(connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_ORDER_PRUNED, err,
			map[string]string{"sku": pruned.SKU, "order": pruned.Order, "pruned": pruned.Pruned.UTC().Format(time.RFC3339Nano)},
			&stockctlv1.OrderPruned{Sku: pruned.SKU, Order: pruned.Order, Pruned: timestamp(pruned.Pruned)})
	case errors.Is(err, coordinator.ErrOrderNotFound):
		return newError(connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_ORDER_NOT_FOUND, err, nil)
	case errors.Is(err, coordinator.ErrContention):
		return newError(connect.CodeAborted, stockctlv1.ErrorReason_ERROR_REASON_CONTENTION, err, nil, retryAfter(50*time.Millisecond))
	case errors.Is(err, coordinator.ErrConflict):
		switch o {
		case opCreate:
			return newError(connect.CodeAlreadyExists, stockctlv1.ErrorReason_ERROR_REASON_SKU_EXISTS, err, nil)
		case opStep:
			return newError(connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_ORDER_STATE_CONFLICT, err, nil)
		case opStock:
			return newError(connect.CodeAlreadyExists, stockctlv1.ErrorReason_ERROR_REASON_DELIVERY_CONFLICT, err, nil)
		default:
			return newError(connect.CodeAlreadyExists, stockctlv1.ErrorReason_ERROR_REASON_ORDER_CONFLICT, err, nil)
		}
	}
	return nil
}

// lockError maps the lock sentinels; nil if err is none of them. A lock
// lost under a stock call (the pool's, during a restock) is the server's
// session ending: nothing was committed, and the call can be retried.
func lockError(o op, err error) *connect.Error {
	switch {
	case errors.Is(err, coordinator.ErrLocked):
		return newError(connect.CodeAborted, stockctlv1.ErrorReason_ERROR_REASON_LOCK_BUSY, err, nil)
	case o == opLock && errors.Is(err, coordinator.ErrLockLost):
		return newError(connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_LOCK_LOST, err, nil)
	case errors.Is(err, coordinator.ErrSessionLost), errors.Is(err, coordinator.ErrLockLost):
		return newError(connect.CodeUnavailable, stockctlv1.ErrorReason_ERROR_REASON_SESSION_LOST, err, nil, retryAfter(100*time.Millisecond))
	}
	return nil
}

// invalidArgument is INVALID_ARGUMENT with a google.rpc.BadRequest naming
// the field, in the request's spelling (route_key, not "route key").
func invalidArgument(err error) *connect.Error {
	field := ""
	var inv *segments.InvalidError
	if errors.As(err, &inv) {
		field = strings.NewReplacer(" ", "_", "-", "_").Replace(inv.Field)
	}
	var fe *fieldError
	if errors.As(err, &fe) {
		field = fe.field
	}
	var details []proto.Message
	if field != "" {
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: field, Description: err.Error()},
		}})
	}
	return newError(connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, err, fieldMeta(field), details...)
}

func fieldMeta(field string) map[string]string {
	if field == "" {
		return nil
	}
	return map[string]string{"field": field}
}

// fieldError is an invalid field of a request that the service checks
// itself (the coordinator checks the rest). It wraps
// coordinator.ErrInvalidArgument.
type fieldError struct {
	field, msg string
}

func (e *fieldError) Error() string { return "invalid " + e.field + ": " + e.msg }
func (e *fieldError) Unwrap() error { return coordinator.ErrInvalidArgument }

func badField(field, msg string) error { return &fieldError{field: field, msg: msg} }

// etcdUnavailable reports whether err says etcd could not be reached or
// could not serve (no leader, its own timeouts, our commit timeout).
func etcdUnavailable(err error) bool {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable || ee.Code() == codes.DeadlineExceeded
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	// The call's ctx is still live (apiError checked), so a deadline is
	// the coordinator's own bound on an etcd round trip.
	return errors.Is(err, context.DeadlineExceeded)
}

func retryAfter(d time.Duration) *errdetails.RetryInfo {
	return &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

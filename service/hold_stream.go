package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
)

// Hold lends a lock for the life of a bidirectional stream; see the proto
// for the protocol. The hold ends in one of these ways:
//
//   - the caller sends release or closes its side: unlock, `released`, OK;
//   - the stream breaks (the caller's process died, its connection
//     dropped, its deadline passed): unlock; nobody to tell;
//   - no message for ttl (a caller paused, or a transport that did not
//     notice a dead peer): unlock, `lost` (KEEPALIVE_TIMEOUT), LOCK_LOST;
//   - the lock is lost (the server's etcd session ended): `lost`
//     (SESSION_LOST), LOCK_LOST;
//   - the server shuts down: unlock, `lost` (SERVER_SHUTDOWN), LOCK_LOST.
func (h lockService) Hold(ctx context.Context, stream *connect.BidiStream[stockctlv1.HoldRequest, stockctlv1.HoldResponse]) error {
	s := h.s
	method := methodLabel(stockctlv1connect.LockServiceHoldProcedure)
	first, err := stream.Receive()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return s.fail(ctx, opLock, method, badField("acquire", "the stream ended before its first message, acquire"))
		}
		return err
	}
	acq := first.GetAcquire()
	if acq == nil {
		return s.fail(ctx, opLock, method, badField("acquire", "the first message of a Hold stream must be acquire"))
	}
	if err := checkASCII(acq); err != nil {
		return s.fail(ctx, opLock, method, err)
	}
	spec, err := parseLockSpec(acq.Name, acq.Kind, acq.Limit, acq.Ttl, acq.Wait)
	if err != nil {
		return s.fail(ctx, opLock, method, err)
	}

	// Read the caller's messages from now on, also while waiting for the
	// lock: a release (or the end of the stream) while waiting gives up
	// the wait. The reader ends when the stream does; it never blocks on
	// msgs once this handler has returned (done).
	done := make(chan struct{})
	defer close(done)
	msgs := make(chan holdMsg, 1)
	go readHold(stream, msgs, done)

	l, pending, err := s.acquireForStream(ctx, spec, msgs)
	if l == nil {
		if pending != nil {
			// The caller withdrew (release, the end of its side, a broken
			// stream) before the lock came: nothing was held.
			switch {
			case pending.err != nil && !errors.Is(pending.err, io.EOF):
				return pending.err
			case pending.req.GetAcquire() != nil:
				return s.fail(ctx, opLock, method, badField("acquire", "a Hold stream acquires once, in its first message"))
			}
			return nil
		}
		return lockBusy(s.fail(ctx, opLock, method, err), spec)
	}
	s.metrics.holds.WithLabelValues(shapeStream).Inc()
	defer s.metrics.holds.WithLabelValues(shapeStream).Dec()
	return s.holdStream(ctx, stream, spec, l, msgs, pending)
}

// acquireForStream acquires spec's lock while watching the caller's
// messages: keep_alive is fine, anything else (release, the end of the
// caller's side, a broken stream, a second acquire) gives up the wait and
// is returned as pending, with the lock if it came all the same.
func (s *Server) acquireForStream(ctx context.Context, spec lockSpec, msgs <-chan holdMsg) (*coordinator.Lock, *holdMsg, error) {
	wctx, cancelWait := context.WithCancelCause(ctx)
	defer cancelWait(nil)
	waitDone := make(chan struct{})
	watcherDone := make(chan struct{})
	var pending *holdMsg // written by the watcher, read once it is done
	go func() {
		defer close(watcherDone)
		for {
			select {
			case m := <-msgs:
				if m.err == nil && m.req.GetKeepAlive() != nil {
					continue
				}
				pending = &m
				cancelWait(errors.New("the caller gave up before the lock was acquired"))
				return
			case <-waitDone:
				return
			}
		}
	}()
	l, err := s.acquire(wctx, spec)
	close(waitDone)
	<-watcherDone
	return l, pending, err
}

// holdStream keeps a stream's lock until one of the ends in Hold's doc.
func (s *Server) holdStream(ctx context.Context, stream *connect.BidiStream[stockctlv1.HoldRequest, stockctlv1.HoldResponse],
	spec lockSpec, l *coordinator.Lock, msgs <-chan holdMsg, pending *holdMsg) error {
	token := l.Token()
	if err := stream.Send(&stockctlv1.HoldResponse{Event: &stockctlv1.HoldResponse_Acquired{Acquired: &stockctlv1.HoldAcquired{
		Name: spec.name, Kind: spec.kind, Token: token, Key: l.Key(), Ttl: durationpb.New(spec.ttl),
		Limit: int32(spec.limit), Revision: l.Revision(),
	}}}); err != nil {
		_ = s.unlock(l)
		return err
	}
	timer := time.NewTimer(spec.ttl)
	defer timer.Stop()
	lostWith := func(reason stockctlv1.LostReason, msg string) error {
		ce := lockLost(spec.name, token, reason, msg)
		_ = stream.Send(&stockctlv1.HoldResponse{Event: &stockctlv1.HoldResponse_Lost{Lost: &stockctlv1.LockLost{
			Name: spec.name, Token: token, Reason: reason, Message: msg,
		}}})
		s.log.Info("api: lock hold ended", "lock", spec.name, "token", token, "reason", reason.String())
		return ce
	}
	// A message that came while waiting, just as the lock was acquired, is
	// handled first: the caller sees acquired, then its answer.
	next := msgs
	if pending != nil {
		ready := make(chan holdMsg, 1)
		ready <- *pending
		next = ready
	}
	for {
		select {
		case m := <-next:
			next = msgs
			switch {
			case m.err != nil && !errors.Is(m.err, io.EOF):
				_ = s.unlock(l) // the stream broke: nobody to tell
				return m.err
			case m.err != nil || m.req.GetRelease() != nil:
				if err := s.unlock(l); lost(err) {
					reason, msg := lostReason(l)
					return lostWith(reason, msg)
				}
				return stream.Send(&stockctlv1.HoldResponse{Event: &stockctlv1.HoldResponse_Released{Released: &stockctlv1.HoldReleased{
					Name: spec.name, Token: token,
				}}})
			case m.req.GetAcquire() != nil:
				_ = s.unlock(l)
				return s.fail(ctx, opLock, methodLabel(stockctlv1connect.LockServiceHoldProcedure),
					badField("acquire", "a Hold stream acquires once, in its first message; the lock was released"))
			}
			timer.Reset(spec.ttl) // any message is a sign of life
		case <-timer.C:
			_ = s.unlock(l)
			return lostWith(stockctlv1.LostReason_LOST_REASON_KEEPALIVE_TIMEOUT,
				fmt.Sprintf("no message for its ttl of %v: the server released it", spec.ttl))
		case <-l.Done():
			reason, msg := lostReason(l)
			_ = s.unlock(l)
			return lostWith(reason, msg)
		case <-s.closing:
			_ = s.unlock(l)
			return lostWith(stockctlv1.LostReason_LOST_REASON_SERVER_SHUTDOWN, "the server shut down and released it")
		case <-ctx.Done():
			_ = s.unlock(l) // the stream broke, or its deadline passed
			return context.Cause(ctx)
		}
	}
}

// holdMsg is one message of the caller, or the error that ended its side
// (io.EOF: it closed it).
type holdMsg struct {
	req *stockctlv1.HoldRequest
	err error
}

func readHold(stream *connect.BidiStream[stockctlv1.HoldRequest, stockctlv1.HoldResponse], msgs chan<- holdMsg, done <-chan struct{}) {
	for {
		req, err := stream.Receive()
		select {
		case msgs <- holdMsg{req: req, err: err}:
		case <-done:
			return
		}
		if err != nil {
			return
		}
	}
}

// Package seats gives each process that sells directly a seat: the
// smallest number that no other live process of the same key space holds,
// kept in etcd under a lease of its own. The segment engine spreads a
// SKU's direct orders by it (segments.seller.directHome): processes of
// different seats start from different segments of every SKU, so that
// their direct commits do not race for one segment's counter.
//
// A seat is a hint, never a fence. Two processes may hold one number for a
// moment (a lease that expired while its process still used the number),
// and a process without a seat (before its claim, after its lease was lost,
// on an etcd that refuses the write) simply picks its segments by a hash;
// in every case the commits' compares keep the books right, and a lost
// race only costs a retry.
package seats

import (
	"context"
	"hash/fnv"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/internal/background"
)

// MaxSeats bounds the numbers claimed: a process that finds them all taken
// goes without a seat.
const MaxSeats = 1024

// retryAfter is how long a claim that failed (etcd unreachable, the lease
// lost) waits before it tries again.
const retryAfter = time.Second

// Seat is one process's claim. Its zero value is not usable; call New.
type Seat struct {
	client *clientv3.Client
	prefix string
	// value is what the seat's key holds: the owner its process names in
	// the segment counters it sells lazily (hex), or "" (Holders).
	value string
	ttl   int
	bg    *background.Group
	log   *slog.Logger

	once    sync.Once
	started atomic.Bool
	held    atomic.Pointer[held] // nil while the process holds none
	lease   atomic.Int64         // the lease of the session under way, 0 when none
	// first is closed when the first claim ends, done or failed.
	first chan struct{}
}

// New returns the seat of a process under prefix (keys.Space.SellersPrefix),
// claimed under a lease of ttl (rounded up to a second) by a goroutine of bg
// from Start on, and given up (its lease revoked) when bg stops. owner, when
// not 0, is written as the seat key's value (Holders reads it): the owner
// the process names in the segment counters it sells lazily, so that a SKU
// created while it holds the seat can be born with its home segment named
// to it (segments.Engine.CreateSKU).
func New(client *clientv3.Client, prefix string, ttl time.Duration, bg *background.Group, log *slog.Logger, owner int64) *Seat {
	s := &Seat{client: client, prefix: prefix, ttl: max(1, int((ttl+time.Second-1)/time.Second)), bg: bg, log: log,
		first: make(chan struct{})}
	if owner > 0 {
		s.value = strconv.FormatInt(owner, 16)
	}
	return s
}

// Start starts the claim in the background, once (the segment engine
// calls it when an order is about to pick a direct segment or sell from
// one): a process that never sells directly never writes a seat.
func (s *Seat) Start() {
	s.once.Do(func() {
		s.started.Store(true)
		s.bg.Go(s.run)
	})
}

// Wait waits, once the claim has been started, until the first claim has
// ended, for at most d or until ctx ends, and returns Index. Orders that
// pick a segment while the process's first claim is under way wait for it,
// so that they start apart too; a claim slower than d leaves them to the
// hash. Before Start it returns -1 at once.
func (s *Seat) Wait(ctx context.Context, d time.Duration) int {
	if !s.started.Load() {
		return -1
	}
	select {
	case <-s.first:
	default:
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-s.first:
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return s.Index()
}

// Lease is the lease the seat is held under, 0 while there is none: a
// lease of this process, which a check for other processes' leases
// (removing a cluster) leaves out.
func (s *Seat) Lease() int64 { return s.lease.Load() }

// Index is the process's seat, or -1 while it holds none (before Start,
// while the claim is under way, after its lease was lost).
func (s *Seat) Index() int {
	if h := s.held.Load(); h != nil {
		return h.index
	}
	return -1
}

// Held is the process's seat and the revision its key was created at (the
// claim's), or -1 and 0 while it holds none. A SKU whose meta record was
// created after that revision was created while the process held the
// seat: its creator's read of the seats saw it (segments.Engine.CreateSKU
// reads them after the meta record's first write).
func (s *Seat) Held() (index int, since int64) {
	if h := s.held.Load(); h != nil {
		return h.index, h.since
	}
	return -1, 0
}

// held is a claim the process holds: its number, and its key's
// CreateRevision.
type held struct {
	index int
	since int64
}

// run holds a seat until ctx ends: a session (a lease kept alive), the
// smallest free number claimed under it, and when the lease is lost, the
// same again.
func (s *Seat) run(ctx context.Context) {
	defer s.firstEnded()
	for ctx.Err() == nil {
		err := s.hold(ctx)
		s.firstEnded()
		if err != nil && ctx.Err() == nil {
			s.log.Debug("direct seller seat: claim failed, trying again", "after", retryAfter, "err", err)
		}
		s.held.Store(nil)
		background.Sleep(ctx, retryAfter)
	}
}

// hold claims a seat under a new session and keeps it until the session
// ends (its lease lost: the seat is then gone) or ctx does (the lease is
// revoked, which frees the seat at once).
func (s *Seat) hold(ctx context.Context) error {
	// The lease is granted under ctx (an unreachable etcd must not hold
	// up a Close); the session that keeps it alive outlives ctx so that
	// the lease can be revoked after ctx ends, and Orphan below stops its
	// keepalive.
	grant, err := s.client.Grant(ctx, int64(s.ttl))
	if err != nil {
		return err
	}
	s.lease.Store(int64(grant.ID))
	defer s.lease.Store(0)
	sess, err := concurrency.NewSession(s.client, concurrency.WithLease(grant.ID), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return err
	}
	defer func() {
		sess.Orphan()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), retryAfter)
		defer cancel()
		_, _ = s.client.Revoke(rctx, sess.Lease())
	}()
	k, since, err := s.claim(ctx, sess.Lease())
	if k >= 0 {
		s.held.Store(&held{index: k, since: since})
	}
	s.firstEnded()
	if err != nil || k < 0 {
		if err == nil {
			s.log.Debug("direct seller seat: all taken", "max", MaxSeats)
			<-ctx.Done()
		}
		return err
	}
	s.log.Debug("direct seller seat claimed", "seat", k, "lease", int64(sess.Lease()))
	select {
	case <-ctx.Done():
	case <-sess.Done():
		s.log.Debug("direct seller seat: lease lost", "seat", k)
	}
	return nil
}

// firstEnded closes first, once.
func (s *Seat) firstEnded() {
	select {
	case <-s.first:
	default:
		close(s.first)
	}
}

// claim writes the smallest number no key under the prefix names, bound to
// lease; another process that claims the same number first makes it try
// the next. It returns the number and the revision of its key's creation,
// or -1 when all MaxSeats are taken.
func (s *Seat) claim(ctx context.Context, lease clientv3.LeaseID) (int, int64, error) {
	for ctx.Err() == nil {
		resp, err := s.client.Get(ctx, s.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return -1, 0, err
		}
		k := Smallest(s.prefix, resp.Kvs)
		if k >= MaxSeats {
			return -1, 0, nil
		}
		key := s.prefix + strconv.Itoa(k)
		tr, err := s.client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, s.value, clientv3.WithLease(lease))).
			Commit()
		if err != nil {
			return -1, 0, err
		}
		if tr.Succeeded {
			return k, tr.Header.Revision, nil
		}
	}
	return -1, 0, ctx.Err()
}

// Smallest is the smallest number that no key of kvs (keys under prefix)
// names; keys that are not a number are not counted.
func Smallest(prefix string, kvs []*mvccpb.KeyValue) int {
	taken := make(map[int]bool, len(kvs))
	for _, kv := range kvs {
		if k, err := strconv.Atoi(strings.TrimPrefix(string(kv.Key), prefix)); err == nil && k >= 0 {
			taken[k] = true
		}
	}
	k := 0
	for taken[k] {
		k++
	}
	return k
}

// Holders returns, for each seat of kvs (the keys and values under
// prefix) whose key holds an owner (New's owner), that owner. Seats of
// processes that name none (eager ones, or binaries older than the value)
// and keys that are not seats are left out.
func Holders(prefix string, kvs []*mvccpb.KeyValue) map[int]int64 {
	out := map[int]int64{}
	for _, kv := range kvs {
		k, err := strconv.Atoi(strings.TrimPrefix(string(kv.Key), prefix))
		if err != nil || k < 0 || len(kv.Value) == 0 {
			continue
		}
		if owner, err := strconv.ParseInt(string(kv.Value), 16, 64); err == nil && owner > 0 {
			out[k] = owner
		}
	}
	return out
}

// Home is seat k's home segment of sku among n: a hash of the SKU moved
// by the seat's place on the ring (Spread). The segment engine's direct
// orders start there (segments.seller.directHome, before any race is
// lost), and a SKU created while seat k is held is born with that segment
// named to the seat's owner.
func Home(sku string, k, n int) int {
	h := fnv.New32a()
	h.Write([]byte(sku))
	return (int(h.Sum32()%uint32(n)) + Spread(k, n)) % n
}

// Spread is where seat k starts on a ring of n places: the k-th (mod n)
// of a permutation of the ring that puts the first seats as far apart as
// their count allows, whatever it is (the places the van der Corput
// sequence 0, 1/2, 1/4, 3/4, 1/8, ... of the ring falls in, each once). So
// the first n seats start at different places, and the first 2, 4 or 8
// evenly spaced when n allows. A seat below 0 starts at 0.
func Spread(k, n int) int {
	if k <= 0 || n <= 1 {
		return 0
	}
	return spreadOf(n)[k%n]
}

var spreads sync.Map // n → []int: the permutation of a ring of n

func spreadOf(n int) []int {
	if p, ok := spreads.Load(n); ok {
		return p.([]int)
	}
	p := make([]int, 0, n)
	seen := make([]bool, n)
	// Every place is reached: the first 2^j values are the multiples of
	// 1/2^j, and once 2^j ≥ n every place (1/n wide) holds one.
	for k := 0; len(p) < n; k++ {
		f, b := 0.0, 0.5
		for i := k; i > 0; i >>= 1 {
			if i&1 == 1 {
				f += b
			}
			b /= 2
		}
		if c := int(f * float64(n)); !seen[c] {
			seen[c] = true
			p = append(p, c)
		}
	}
	spreads.Store(n, p)
	return p
}

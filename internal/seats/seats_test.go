package seats

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

const prefix = "/t/sellers/"

func TestSpreadIsAPermutation(t *testing.T) {
	for n := 1; n <= 1024; n++ {
		seen := make([]bool, n)
		for k := range n {
			i := Spread(k, n)
			if i < 0 || i >= n || seen[i] {
				t.Fatalf("n %d: seat %d starts at %d, out of the ring or taken by an earlier seat", n, k, i)
			}
			seen[i] = true
		}
		if n > 1 && Spread(n, n) != Spread(0, n) {
			t.Fatalf("n %d: seat n does not start where seat 0 does", n)
		}
	}
}

func TestSpreadPutsTheFirstSeatsApart(t *testing.T) {
	cases := []struct {
		n    int
		want []int // where seats 0, 1, 2, ... start
	}{
		{n: 1, want: []int{0, 0}},
		{n: 2, want: []int{0, 1, 0}},
		{n: 3, want: []int{0, 1, 2}}, // 1/4 falls in 0's place: the next free one
		{n: 4, want: []int{0, 2, 1, 3}},
		{n: 20, want: []int{0, 10, 5, 15, 2, 12, 7, 17}},
		{n: 100, want: []int{0, 50, 25, 75}},
	}
	for _, c := range cases {
		var got []int
		for k := range c.want {
			got = append(got, Spread(k, c.n))
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("n %d: seats start at %v, want %v", c.n, got, c.want)
		}
	}
	if Spread(-1, 20) != 0 {
		t.Errorf("no seat (-1) starts at %d, want 0", Spread(-1, 20))
	}
}

func TestSmallest(t *testing.T) {
	kvs := func(names ...string) []*mvccpb.KeyValue {
		var out []*mvccpb.KeyValue
		for _, n := range names {
			out = append(out, &mvccpb.KeyValue{Key: []byte(prefix + n)})
		}
		return out
	}
	cases := []struct {
		name string
		kvs  []*mvccpb.KeyValue
		want int
	}{
		{"none", nil, 0},
		{"a gap", kvs("0", "1", "3"), 2},
		{"unsorted", kvs("2", "0", "1"), 3},
		{"not numbers are not counted", kvs("x", "-1", "0", ""), 1},
	}
	for _, c := range cases {
		if got := Smallest(prefix, c.kvs); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// process is one process's seat, with the group that stops it.
type process struct {
	seat *Seat
	bg   *background.Group
}

// start starts a process's claim under a lease of ttl.
func start(client *clientv3.Client, ttl time.Duration) *process {
	bg := background.NewGroup()
	s := New(client, prefix, ttl, bg, slog.New(slog.DiscardHandler), 0)
	s.Start()
	return &process{seat: s, bg: bg}
}

func (p *process) stop() { p.bg.Stop(); p.bg.Wait() }

// waitIndex waits (up to 20 s) until p holds a seat other than not, and
// returns it.
func waitIndex(t *testing.T, p *process, not int) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if k := p.seat.Index(); k >= 0 && k != not {
			return k
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no seat after 20 s (now %d)", p.seat.Index())
	return -1
}

func holders(t *testing.T, client *clientv3.Client) []string {
	t.Helper()
	resp, err := client.Get(t.Context(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Key[len(prefix):]))
	}
	slices.Sort(out)
	return out
}

// Processes claiming at once get different seats, the smallest free ones;
// a stopped process's seat is free at once (its lease revoked: the leases
// here live 30 s), and the next process takes it.
func TestProcessesClaimDifferentSeats(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	procs := make([]*process, 5)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() { procs[i] = start(client, 30*time.Second) })
	}
	wg.Wait()
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	var got []int
	for _, p := range procs {
		got = append(got, waitIndex(t, p, -1))
	}
	slices.Sort(got)
	if !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("five processes hold seats %v, want 0 to 4 once each", got)
	}
	if h := holders(t, client); !slices.Equal(h, []string{"0", "1", "2", "3", "4"}) {
		t.Fatalf("etcd holds %v", h)
	}
	for _, p := range procs {
		resp, err := client.Get(t.Context(), prefix+fmt.Sprint(p.seat.Index()))
		if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease != p.seat.Lease() || p.seat.Lease() == 0 {
			t.Fatalf("seat %d's key %v (%v), its Lease %x", p.seat.Index(), resp, err, p.seat.Lease())
		}
	}

	freed := procs[2].seat.Index()
	procs[2].stop()
	// Stop waits for the revoke, which a machine busy enough may time out
	// (it is bounded, so that Close is): the key is then gone within the
	// lease's TTL. 10 s is well short of it.
	for deadline := time.Now().Add(10 * time.Second); slices.Contains(holders(t, client), fmt.Sprint(freed)); {
		if time.Now().After(deadline) {
			t.Fatalf("seat %d still held in etcd 10 s after its process stopped: %v", freed, holders(t, client))
		}
		time.Sleep(10 * time.Millisecond)
	}
	procs[2] = start(client, 30*time.Second)
	if k := waitIndex(t, procs[2], -1); k != freed {
		t.Fatalf("a new process took seat %d, want the freed %d", k, freed)
	}
}

// A process whose lease is lost (revoked behind its back, as an expiry
// would) notices, and claims a seat again under a new lease, beside a
// process that claimed meanwhile.
func TestLostLeaseClaimsAgain(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	p := start(client, time.Second)
	defer p.stop()
	k := waitIndex(t, p, -1)
	resp, err := client.Get(t.Context(), prefix+fmt.Sprint(k))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("seat %d's key: %v %v", k, resp, err)
	}
	old := resp.Kvs[0].Lease
	if _, err := client.Revoke(t.Context(), clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	other := start(client, time.Second)
	defer other.stop()
	deadline := time.Now().Add(20 * time.Second)
	for {
		pi, oi := p.seat.Index(), other.seat.Index()
		if pi >= 0 && oi >= 0 && pi != oi {
			resp, err := client.Get(t.Context(), prefix+fmt.Sprint(pi))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) == 1 && resp.Kvs[0].Lease != old {
				break // claimed again, under a new lease
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 s after its lease was revoked: the process holds %d, the other %d, etcd %v", pi, oi, holders(t, client))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if h := holders(t, client); !slices.Equal(h, []string{"0", "1"}) {
		t.Fatalf("etcd holds %v, want 0 and 1", h)
	}
}

// A process that never starts never writes a seat.
func TestNoClaimBeforeStart(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	bg := background.NewGroup()
	s := New(client, prefix, time.Second, bg, slog.New(slog.DiscardHandler), 0)
	// Before Start, Wait does not wait (a refused order must not).
	waitStart := time.Now()
	if k := s.Wait(t.Context(), time.Hour); k != -1 || time.Since(waitStart) > 10*time.Second {
		t.Fatalf("Wait before Start: %d after %v; want -1 at once", k, time.Since(waitStart))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	<-ctx.Done()
	bg.Stop()
	bg.Wait()
	if s.Index() != -1 || len(holders(t, client)) != 0 {
		t.Fatalf("a seat never started holds %d; etcd %v", s.Index(), holders(t, client))
	}
}

// A seat's key holds its process's owner (New's owner), which Holders
// reads back; a seat that names none (owner 0: an eager process, or a
// binary older than the value), a value that is not a positive hex
// number, and a key that is not a seat are left out.
func TestHoldersReadTheOwners(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	bg := background.NewGroup()
	t.Cleanup(func() { bg.Stop(); bg.Wait() })
	named := New(client, prefix, 10*time.Second, bg, slog.New(slog.DiscardHandler), 0xbeef)
	named.Start()
	p := &process{seat: named, bg: bg}
	k := waitIndex(t, p, -1)
	resp, err := client.Get(t.Context(), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if got := Holders(prefix, resp.Kvs); len(got) != 1 || got[k] != 0xbeef {
		t.Fatalf("Holders of one named seat %d = %v", k, got)
	}
	kv := func(key, value string) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(prefix + key), Value: []byte(value)}
	}
	got := Holders(prefix, []*mvccpb.KeyValue{kv("0", "1f"), kv("1", ""), kv("2", "zz"), kv("3", "-5"), kv("x", "1f"), kv("4", "0"), kv("5", "7fffffffffffffff")})
	if want := map[int]int64{0: 0x1f, 5: 0x7fffffffffffffff}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Holders = %v, want %v", got, want)
	}
}

// Home is the same segment for a SKU and a seat wherever it is worked
// out, within the ring, and seats of one SKU start at different segments
// while there are fewer seats than segments.
func TestHomeSpreadsTheSeats(t *testing.T) {
	for _, n := range []int{1, 2, 4, 20} {
		for _, sku := range []string{"a", "sku-0042", "Ω"} {
			seen := map[int]bool{}
			for k := range n {
				h := Home(sku, k, n)
				if h < 0 || h >= n || seen[h] || Home(sku, k, n) != h {
					t.Fatalf("Home(%q, %d, %d) = %d: out of the ring, shared or unsteady (seen %v)", sku, k, n, h, seen)
				}
				seen[h] = true
			}
		}
	}
}

package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/segments"
)

// list shows the SKUs (table and JSON); policy changes a SKU's refill
// policy mid-sale, keeping what it is not given, and the next rebalancer
// pass refills by the new batch.
func TestListAndPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var empty listView
	e.json(&empty, "list")
	if len(empty.SKUs) != 0 || empty.Revision == 0 {
		t.Fatalf("list of an empty prefix: %+v", empty)
	}
	if out := e.ok("list"); !strings.Contains(out, "no SKU under this prefix") {
		t.Fatalf("list table of an empty prefix:\n%s", out)
	}
	e.ok("init", "b-sku", "--total", "100", "--segments", "4", "--initial-fill", "0", "--low-watermark", "2", "--refill-batch", "10")
	e.ok("init", "a-sku", "--total", "10", "--segments", "1", "--per-user-limit", "3")
	var l listView
	e.json(&l, "list")
	if len(l.SKUs) != 2 || l.SKUs[0].SKU != "a-sku" || l.SKUs[1].SKU != "b-sku" || l.SKUs[0].PerUserLimit != 3 ||
		l.SKUs[1].Segments != 4 || l.SKUs[1].RefillBatch != 10 || l.SKUs[1].Created.IsZero() {
		t.Fatalf("list: %+v", l)
	}
	out := e.ok("list")
	for _, want := range []string{"SKU    TOTAL  SEGMENTS  LOW WATERMARK  REFILL BATCH  PER-USER LIMIT  CREATED", "a-sku  10     1", "b-sku  100    4         2              10            none"} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}

	var p policyView
	e.json(&p, "policy", "b-sku", "--refill-batch", "5")
	if p.LowWatermark != 2 || p.RefillBatch != 5 {
		t.Fatalf("policy: %+v, want the watermark kept (2) and batch 5", p)
	}
	var pass passView
	e.json(&pass, "rebalance", "b-sku")
	if len(pass.Moves) != 4 {
		t.Fatalf("pass %+v, want a refill of each of 4 segments", pass)
	}
	for _, m := range pass.Moves {
		if m.Qty != 5 {
			t.Fatalf("a refill of %d units after the policy set 5: %+v", m.Qty, pass)
		}
	}
	if out := e.ok("status", "b-sku"); !strings.Contains(out, "refill 5 when a segment holds less than 2") {
		t.Fatalf("status after policy:\n%s", out)
	}
	e.fails(ExitUsage, "nothing to change", "policy", "b-sku")
	e.fails(ExitUsage, "invalid --refill-batch -1", "policy", "b-sku", "--refill-batch", "-1")
	e.fails(ExitNotFound, "failed to set the policy of nope: unknown SKU", "policy", "nope", "--low-watermark", "1")
}

// prune archives orders (status and audit still balance, the live
// reservation stays, a retry of a pruned order is refused while its ID is
// kept, and a new order once --keep-ids ended); delete refuses a
// SKU that still has a live reservation or stock, and deletes a done one.
func TestPruneAndDeleteCommands(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "old", "--total", "20", "--segments", "2")
	e.ok("allocate", "old", "--order", "p-1", "--qty", "2")
	e.ok("allocate", "old", "--order", "p-2", "--qty", "3")
	e.ok("release", "old", "--order", "p-2")
	e.ok("reserve", "old", "--order", "p-3", "--qty", "1", "--ttl", "1h")

	var p pruneView
	e.json(&p, "prune", "old", "--older-than", "1ns")
	if p.Orders != 2 || p.Units != 2 || p.Released != 1 || p.Archive.Orders != 2 || p.Archive.Units != 2 || p.Revision == 0 ||
		p.KeepIDs != "24h0m0s" || p.Archive.Claims != 2 {
		t.Fatalf("prune: %+v, want 2 orders archived (p-1's 2 units; p-2 released), p-3 kept, their 2 IDs kept 24h", p)
	}
	var au auditView
	e.json(&au, "audit", "old")
	if !au.OK || au.Archived != 2 || au.ArchivedOrders != 2 || au.Orders != 1 || au.Allocated != 1 {
		t.Fatalf("audit after prune: %+v", au)
	}
	if out := e.ok("audit", "old"); !strings.Contains(out, "+ archived 2") {
		t.Fatalf("audit table after prune:\n%s", out)
	}
	var st statusView
	e.json(&st, "status", "old")
	if st.Allocated != 3 || st.Archived != 2 || st.ArchivedOrders != 2 || st.Orders != 1 || len(st.Etcd) != 1 || st.Etcd[0].DBSize == 0 {
		t.Fatalf("status after prune: %+v", st)
	}
	// A retry of a pruned order is refused, and so is its release.
	e.fails(ExitPruned, `order "p-1" of SKU "old" was archived by prune at`, "allocate", "old", "--order", "p-1", "--qty", "2")
	e.fails(ExitPruned, "a retry of it is refused", "release", "old", "--order", "p-2")
	e.fails(ExitUsage, "invalid --keep-ids -1s", "prune", "old", "--older-than", "1ns", "--keep-ids", "-1s")
	// --keep-ids 0 forgets the kept IDs: p-1 is a new order again.
	e.json(&p, "prune", "old", "--older-than", "1ns", "--keep-ids", "0")
	if p.Orders != 0 || p.Forgotten != 2 || p.Archive.Claims != 0 || p.Archive.Orders != 2 {
		t.Fatalf("prune --keep-ids 0: %+v, want the 2 kept IDs forgotten", p)
	}
	if out := e.ok("prune", "old", "--older-than", "1ns", "--keep-ids", "0"); !strings.Contains(out, "forgotten at once") {
		t.Fatalf("prune --keep-ids 0 table:\n%s", out)
	}
	var a allocationView
	e.json(&a, "allocate", "old", "--order", "p-1", "--qty", "2")
	if a.Replayed {
		t.Fatalf("a forgotten order ID replayed: %+v", a)
	}
	e.fails(ExitUsage, "missing --older-than", "prune", "old")
	e.fails(ExitUsage, "invalid --older-than", "prune", "old", "--older-than", "-1h")

	e.fails(ExitConflict, "failed to delete old: it still holds 15 units in its pool and segments (--force deletes them with it)", "delete", "old")
	e.fails(ExitConflict, `failed to delete old: conflict: reservation "p-3" is still live`, "delete", "old", "--force")
	e.ok("cancel", "old", "--order", "p-3")
	var d deleteView
	e.json(&d, "delete", "old", "--force")
	if d.Total != 20 || d.Remaining != 16 || d.Allocated != 4 || d.Orders != 4 {
		t.Fatalf("delete: %+v", d)
	}
	var l listView
	e.json(&l, "list")
	if len(l.SKUs) != 0 {
		t.Fatalf("list after delete: %+v", l)
	}
	// The space reserve is the key space's, not the SKU's: it stays.
	keys := fingerprint(t, e.prefix)
	if _, ok := keys[e.prefix+"space-reserve"]; !ok {
		t.Fatalf("the space reserve is gone after delete: %v", keys)
	}
	if delete(keys, e.prefix+"space-reserve"); len(keys) != 0 {
		t.Fatalf("keys left under the prefix after delete: %v", keys)
	}
	e.fails(ExitNotFound, "failed to delete old: unknown SKU", "delete", "old", "--force")
}

// An etcd with a small quota driven full by a sale: the operator sees the
// database filling in status (ETCD line) and in the metrics, then every
// write refused with an error naming NOSPACE and what to do, while reads
// still work; reclaim (compact, defragment, disarm) and prune bring it
// back, and the books balance throughout.
//
// Twice: the selling process eager (its commits rewrite the counters, so
// reclaim frees their history), and lazy (coordinator.WithLazySegments:
// it writes little but records, so at the quota the database is its live
// records, which no compaction frees, as any sale's is once automatic
// compaction has run; without the space reserve, reclaim left it at its
// quota and etcd refused prune's first write, 4 runs of 4).
func TestNoSpaceAndRecovery(t *testing.T) {
	t.Parallel()
	for _, lazy := range []bool{false, true} {
		t.Run(map[bool]string{false: "eager", true: "lazy"}[lazy], func(t *testing.T) {
			t.Parallel()
			testNoSpaceAndRecovery(t, lazy)
		})
	}
}

func testNoSpaceAndRecovery(t *testing.T, lazy bool) {
	const quota = 1 << 20
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), etcdtest.WithQuotaBackendBytes(quota))
	ep := etcd.Endpoints()[0]
	// The space guard is off: this is the recovery when etcd's own quota
	// was reached (other writers, members older than 3.6, or the guard
	// turned off). TestSpaceGuard is the guard's.
	cli := func(args ...string) result {
		return run(t, append([]string{"--endpoints", ep, "--space-guard", "0"}, args...)...)
	}
	if r := cli("init", "big", "--total", "1000000", "--segments", "2"); r.code != 0 {
		t.Fatalf("init: %+v", r)
	}
	client := etcd.Client(t)
	opts := []coordinator.Option{coordinator.WithSpaceGuard(0), coordinator.WithEagerSegments()}
	if lazy {
		opts = append(opts, coordinator.WithLazySegments())
	}
	c, err := coordinator.New(client, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	size := func() int64 {
		st, err := client.Status(t.Context(), ep)
		if err != nil {
			t.Fatal(err)
		}
		return st.DbSize
	}
	// Orders until etcd refuses one; on the way, status warns.
	warned := false
	n := 0
	for ; ; n++ {
		_, err := c.Allocate(t.Context(), "big", fmt.Sprintf("fill-%06d", n), 1, "")
		if errors.Is(err, coordinator.ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatalf("order %d: %v", n, err)
		}
		if !warned && n%50 == 0 && float64(size()) >= quota*spaceWarnFraction {
			r := cli("status", "big")
			if r.code != 0 || !strings.Contains(r.stdout, "of a 1.0 MiB quota") || !strings.Contains(r.stdout, "prune old orders") {
				t.Fatalf("status near the quota: %+v", r)
			}
			warned = true
		}
	}
	if !warned {
		t.Fatalf("etcd refused a write after %d orders without status ever warning", n)
	}

	r := cli("allocate", "big", "--order", "one-more", "--qty", "1")
	checkFails(t, r, ExitFailure, "database space exceeded", []string{"allocate"})
	for _, want := range []string{"NOSPACE", "stockctl reclaim", "stockctl prune", "docs/operations.md"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the refused write's error does not say %q: %s", want, r.stderr)
		}
	}
	r = cli("status", "big")
	if r.code != 0 || !strings.Contains(r.stdout, "alarm NOSPACE: etcd refuses every write") {
		t.Fatalf("status under NOSPACE: %+v", r)
	}
	if r := cli("audit", "big"); r.code != 0 {
		t.Fatalf("audit under NOSPACE: %+v", r)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newEtcdCollector(client, []string{ep}))
	want := fmt.Sprintf(`
# HELP stockctl_etcd_alarm 1 for each alarm the etcd member has raised (NOSPACE: every write refused; CORRUPT).
# TYPE stockctl_etcd_alarm gauge
stockctl_etcd_alarm{alarm="NOSPACE",endpoint=%q} 1
# HELP stockctl_etcd_quota_backend_bytes The etcd member's --quota-backend-bytes (0: not reported, etcd before 3.6): at it, etcd raises NOSPACE and refuses every write.
# TYPE stockctl_etcd_quota_backend_bytes gauge
stockctl_etcd_quota_backend_bytes{endpoint=%q} %d
`, ep, ep, quota)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "stockctl_etcd_alarm", "stockctl_etcd_quota_backend_bytes"); err != nil {
		t.Fatal(err)
	}

	// Recovery, as docs/operations.md says: reclaim, prune, reclaim.
	var rec reclaimView
	if r := cli("-o", "json", "reclaim"); r.code != 0 {
		t.Fatalf("reclaim: %+v", r)
	} else {
		decode(t, r.stdout, &rec)
	}
	if rec.Disarmed != 1 || len(rec.After) != 1 || len(rec.After[0].Alarms) != 0 || rec.After[0].DBSize >= rec.Before[0].DBSize {
		t.Fatalf("reclaim: %+v", rec)
	}
	// The space reserve init set aside is what makes room for prune when
	// live records fill the quota (compaction cannot free them): reclaim
	// released it, and wrote it back only where the database has room to
	// spare (eager: the counters' history freed it), never where live
	// records fill it (lazy).
	if rec.ReserveReleased != segments.SpaceReserveBytes || rec.ReserveRestored != roomForReserve(rec.After) || (lazy && rec.ReserveRestored) {
		t.Fatalf("reclaim under NOSPACE released %d bytes of space reserve (want %d), restored %v: %+v",
			rec.ReserveReleased, segments.SpaceReserveBytes, rec.ReserveRestored, rec)
	}
	// A quarter of the reserve, not all of it: the database's size after a
	// defragment is whole bolt pages, and the selling process may write
	// (a settle) between the disarm and this read; beside four busy loops
	// the room was 24,576 bytes twice in ~32 runs. Without the reserve it
	// is ~0, and prune's rounds below are the proof that the room suffices.
	if room := rec.After[0].Quota - rec.After[0].DBSize; room < segments.SpaceReserveBytes/4 {
		t.Fatalf("reclaim left %d bytes under the quota, want at least a quarter of the %d-byte reserve it released: %+v",
			room, segments.SpaceReserveBytes, rec)
	}
	// The order that crossed the quota may have been applied (etcd applies
	// that one write and answers NOSPACE): its retry under its ID tells.
	// If it was not, its retry is a write, which a database whose live
	// records fill the quota still refuses (the records leave only with
	// prune): it is retried after the recovery.
	var retried allocationView
	crossing := fmt.Sprintf("fill-%06d", n)
	retryLater := false
	if r := cli("-o", "json", "allocate", "big", "--order", crossing, "--qty", "1"); r.code != 0 {
		if !strings.Contains(r.stderr, "database space exceeded") {
			t.Fatalf("the retry of the order refused at the quota: %+v", r)
		}
		if resp, err := client.Get(t.Context(), coordinator.DefaultPrefix+"orders/big/"+crossing); err != nil || len(resp.Kvs) != 0 {
			t.Fatalf("the retry was refused for space, but the order has a record (%v): it should have replayed", err)
		}
		retryLater = true
	} else {
		decode(t, r.stdout, &retried)
	}
	t.Logf("the order that crossed the quota had been applied: %v; its retry was refused for space: %v", retried.Replayed, retryLater)
	// Prune's deletes write tombstones, which take space until the next
	// compaction: while etcd is nearly full a prune may stop part way
	// (each batch whole, the books balanced). Reclaim and prune again; each
	// round frees what the last one archived.
	pruneRounds := func(args ...string) {
		t.Helper()
		for round := 1; ; round++ {
			r := cli(append([]string{"prune", "big", "--older-than", "1ns"}, args...)...)
			if r.code == 0 {
				t.Logf("prune %v completed in round %d", args, round)
				break
			}
			if round == 10 || !strings.Contains(r.stderr, "NOSPACE") || !strings.Contains(r.stderr, "run it again to go on") {
				t.Fatalf("prune %v, round %d: %+v", args, round, r)
			}
			if r := cli("reclaim"); r.code != 0 {
				t.Fatalf("reclaim, round %d: %+v", round, r)
			}
			if r := cli("audit", "big"); r.code != 0 {
				t.Fatalf("audit after a prune stopped part way: %+v", r)
			}
		}
		if r := cli("reclaim"); r.code != 0 {
			t.Fatalf("the reclaim after prune %v: %+v", args, r)
		}
	}
	pruneRounds()
	if r := cli("allocate", "big", "--order", "one-more", "--qty", "1"); r.code != 0 {
		t.Fatalf("an order after the recovery: %+v", r)
	}
	archived, live := int64(n)+1, int64(1)
	if retryLater {
		if r := cli("-o", "json", "allocate", "big", "--order", crossing, "--qty", "1"); r.code != 0 {
			t.Fatalf("the retry of the order refused at the quota, after the recovery: %+v", r)
		} else if decode(t, r.stdout, &retried); retried.Replayed {
			t.Fatalf("the order refused at the quota replayed after the recovery: %+v", retried)
		}
		archived, live = int64(n), 2
	}
	var au auditView
	if r := cli("-o", "json", "audit", "big"); r.code != 0 {
		t.Fatalf("audit after the recovery: %+v", r)
	} else {
		decode(t, r.stdout, &au)
	}
	if au.ArchivedOrders != archived || au.Orders != live || au.Allocated+au.Archived != int64(n)+2 {
		t.Fatalf("audit after the recovery: %+v (%d orders before the quota)", au, n)
	}
	// The pruned orders' claims (kept 24 h) are most of a record's size:
	// where the live records alone had filled the quota (lazy), the
	// claims may still fill most of it, and status says so. docs/operations.md's next step:
	// forget the IDs (--keep-ids 0), then reclaim.
	forgot := false
	if r := cli("status", "big"); r.code != 0 {
		t.Fatalf("status after the recovery: %+v", r)
	} else if i := strings.Index(r.stdout, "ETCD"); i >= 0 {
		t.Logf("the kept claims fill the database: %s", r.stdout[i:])
		pruneRounds("--keep-ids", "0")
		forgot = true
	}
	var last reclaimView
	if r := cli("-o", "json", "reclaim"); r.code != 0 {
		t.Fatalf("a reclaim after the recovery: %+v", r)
	} else {
		decode(t, r.stdout, &last)
	}
	if want := forgot || roomForReserve(last.After); last.ReserveRestored != want {
		t.Fatalf("a reclaim after the recovery restored the space reserve: %v, want %v: %+v", last.ReserveRestored, want, last)
	}
	if r := cli("status", "big"); r.code != 0 || strings.Contains(r.stdout, "ETCD") {
		t.Fatalf("status after the recovery still warns: %+v", r)
	}
}

// serve's embedded etcd compacts its history by itself (it never did):
// with --auto-compaction-retention 1s, a revision of the first writes is
// soon compacted away; the default retention is on (an hour).
func TestServeCompacts(t *testing.T) {
	t.Parallel()
	if DefaultAutoCompactionRetention <= 0 {
		t.Fatalf("serve's compaction is off by default")
	}
	srv := startServe(t, "compacting", "--auto-compaction-retention", "1s", "--quota-backend-bytes", "67108864")
	srv.ok(t, "init", "hist", "--total", "100", "--segments", "2")
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + srv.addr}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	first, err := client.Get(t.Context(), "/stockctl/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, "the embedded etcd to compact its history", 60*time.Second, func() bool {
		// Writes move the revision on, so that there is history to compact.
		if _, err := client.Put(t.Context(), "/compaction-test/tick", time.Now().String()); err != nil {
			t.Fatal(err)
		}
		_, err := client.Get(t.Context(), "/stockctl/meta/hist", clientv3.WithRev(first.Header.Revision))
		return errors.Is(err, rpctypes.ErrCompacted)
	})
	st, err := client.Status(t.Context(), "http://"+srv.addr)
	if err != nil || st.DbSizeQuota != 67108864 {
		t.Fatalf("quota %d, %v; want --quota-backend-bytes 67108864", st.DbSizeQuota, err)
	}
	srv.stop(t)
}

// The space guard (on by default): a sale that drives etcd's database
// toward its quota is refused new orders before etcd raises NOSPACE, with
// an error that says so and what to do, while a retry of an applied order
// still replays and releases still write; prune then makes room (no
// alarm is ever raised), and orders are served again. The books balance
// throughout.
func TestSpaceGuard(t *testing.T) {
	t.Parallel()
	const quota = 1 << 20
	// A sale on this machine fills a 1 MiB quota in about a second: the
	// default line (95 %) leaves 52 KiB, which it crosses between two of
	// the guard's readings; 80 % leaves room (a real quota is GiBs).
	const line = 0.8
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), etcdtest.WithQuotaBackendBytes(quota))
	ep := etcd.Endpoints()[0]
	cli := func(args ...string) result {
		return run(t, append([]string{"--endpoints", ep, "--space-guard", fmt.Sprint(line)}, args...)...)
	}
	if r := cli("init", "big", "--total", "1000000", "--segments", "2"); r.code != 0 {
		t.Fatalf("init: %+v", r)
	}
	client := etcd.Client(t)
	c, err := coordinator.New(client, coordinator.WithSpaceGuard(line))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	alarms := func() int {
		resp, err := client.AlarmList(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Alarms)
	}
	n := 0
	var low *coordinator.SpaceLowError
	for ; ; n++ {
		_, err = c.Allocate(t.Context(), "big", fmt.Sprintf("fill-%06d", n), 1, "")
		if errors.As(err, &low) {
			break
		}
		if err != nil {
			t.Fatalf("order %d: %v (the guard should have refused before etcd's quota)", n, err)
		}
	}
	if !errors.Is(err, coordinator.ErrNoSpace) || low.Quota != quota || float64(low.Size) < line*quota || low.Fraction != line {
		t.Fatalf("the guard's refusal after %d orders: %+v (matches ErrNoSpace: %v)", n, low, errors.Is(err, coordinator.ErrNoSpace))
	}
	if a := alarms(); a != 0 {
		t.Fatalf("%d alarms raised: the guard let the database reach the quota", a)
	}
	r := cli("allocate", "big", "--order", "new", "--qty", "1")
	checkFails(t, r, ExitFailure, "new orders refused", []string{"allocate"})
	for _, want := range []string{"space guard", "stockctl prune", "docs/operations.md"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the guard's refusal does not say %q: %s", want, r.stderr)
		}
	}
	// A retry of an applied order replays; a release writes.
	var v allocationView
	if r := cli("-o", "json", "allocate", "big", "--order", "fill-000007", "--qty", "1"); r.code != 0 {
		t.Fatalf("a retry under the guard: %+v", r)
	} else if decode(t, r.stdout, &v); !v.Replayed {
		t.Fatalf("a retry under the guard was not a replay: %+v", v)
	}
	if r := cli("release", "big", "--order", "fill-000003"); r.code != 0 {
		t.Fatalf("a release under the guard: %+v", r)
	}
	if r := cli("status", "big"); r.code != 0 || !strings.Contains(r.stdout, "of a 1.0 MiB quota") || strings.Contains(r.stdout, "alarm NOSPACE") {
		t.Fatalf("status under the guard: %+v", r)
	}
	if r := cli("audit", "big"); r.code != 0 {
		t.Fatalf("audit under the guard: %+v", r)
	}
	// Recovery: prune and reclaim. Prune's deletes write tombstones, which
	// take space until compaction: on a 1 MiB quota a prune may stop part
	// way, and reclaim and prune again go on.
	for round := 1; ; round++ {
		r := cli("prune", "big", "--older-than", "1ns", "--keep-ids", "0")
		if r.code == 0 {
			t.Logf("prune completed in round %d", round)
			break
		}
		if round == 10 || !strings.Contains(r.stderr, "run it again to go on") {
			t.Fatalf("prune, round %d: %+v", round, r)
		}
		if r := cli("reclaim"); r.code != 0 {
			t.Fatalf("reclaim, round %d: %+v", round, r)
		}
	}
	if r := cli("reclaim"); r.code != 0 {
		t.Fatalf("reclaim: %+v", r)
	}
	// The process's guard reads the database again within a second.
	etcdtest.WaitFor(t, "the guard to let orders through again", 30*time.Second, func() bool {
		_, err := c.Allocate(t.Context(), "big", "after-recovery", 1, "")
		if err != nil && !errors.As(err, &low) {
			t.Fatal(err)
		}
		return err == nil
	})
	if r := cli("allocate", "big", "--order", "new", "--qty", "1"); r.code != 0 {
		t.Fatalf("the refused order, retried after the recovery: %+v", r)
	}
	var au auditView
	if r := cli("-o", "json", "audit", "big"); r.code != 0 {
		t.Fatalf("audit after the recovery: %+v", r)
	} else {
		decode(t, r.stdout, &au)
	}
	// n orders before the guard, one released; then two more.
	if au.Allocated+au.Archived != int64(n)-1+2 || au.Orders != 2 {
		t.Fatalf("audit after the recovery: %+v (%d orders before the guard, one released)", au, n)
	}
}

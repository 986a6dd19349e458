package cli

import (
	"strings"
	"testing"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/internal/keys"
)

// status names the rebalancer elected now, not only the one that made the
// last pass (which may be a process killed since): here a candidate wins
// the election after a pass by another, as when a serve is killed.
func TestStatusNamesTheElectedRebalancer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "tv", "--total", "100", "--segments", "2", "--initial-fill", "10", "--low-watermark", "8")
	e.ok("--identity", "old-serve", "rebalance", "tv") // one elected pass, then it resigns
	var before statusView
	e.json(&before, "status", "tv")
	if before.Leader != "" || before.Rebalancer == nil || before.Rebalancer.Leader != "old-serve" {
		t.Fatalf("status before: leader %q, last pass %+v; want none elected, a pass by old-serve", before.Leader, before.Rebalancer)
	}

	ks, err := keys.New(e.prefix)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := concurrency.NewSession(shared.client)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := concurrency.NewElection(sess, ks.Election()).Campaign(t.Context(), "new-serve"); err != nil {
		t.Fatal(err)
	}
	var after statusView
	e.json(&after, "status", "tv")
	if after.Leader != "new-serve" || after.Rebalancer.Leader != "old-serve" {
		t.Fatalf("status: leader %q, last pass by %q; want new-serve elected, the last pass by old-serve", after.Leader, after.Rebalancer.Leader)
	}
	out := e.ok("status", "tv")
	for _, want := range []string{"LEADER      new-serve", "REBALANCER  last pass by old-serve"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
}

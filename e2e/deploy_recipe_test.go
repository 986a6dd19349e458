package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// recipeBound bounds the whole recipe: certificates, a 3-member etcd,
// serve, a sale with the etcd leader stopped, HAProxy, a second cluster
// added and removed.
const recipeBound = 4 * time.Minute

// TestDeployRecipe runs scripts/deploy-recipe.sh, docs/deploy.md's recipe on
// loopback: openssl's CA and certificates, a 3-member etcd cluster with TLS
// for clients and peers and authentication, its root and prefix-limited
// users, `stockctl serve` (the binary of this tree) and commands through it,
// a sale through the API during which the etcd leader is stopped (every
// order acknowledged, some while it is down, the books balanced) and then
// started again, reclaim as root, HAProxy when installed, and a second
// etcd cluster added to the fleet, given a SKU, and removed again
// (refused while the SKU is there, then done; the old list and a merged
// cursor without it refused).
// It skips only when the tools the recipe needs are missing; any failing
// step fails the test with the script's output.
func TestDeployRecipe(t *testing.T) {
	etcd := os.Getenv("STOCKCTL_ETCD_BIN")
	if etcd == "" {
		etcd = lookAny("etcd", "/usr/bin/etcd")
	}
	etcdctl := lookAny("etcdctl", "/usr/bin/etcdctl")
	switch {
	case etcd == "":
		t.Skip("deploy recipe: no etcd server binary (Debian/Ubuntu: apt-get install etcd-server, or set STOCKCTL_ETCD_BIN)")
	case etcdctl == "":
		t.Skip("deploy recipe: no etcdctl, which creates the recipe's etcd users (Debian/Ubuntu: apt-get install etcd-client)")
	case lookAny("openssl") == "":
		t.Skip("deploy recipe: no openssl, which creates the recipe's certificates")
	case lookAny("curl") == "":
		t.Skip("deploy recipe: no curl, which makes the recipe's API calls and health checks")
	}
	if lookAny("haproxy") == "" {
		t.Log("deploy recipe: haproxy is not installed: the script skips its step")
	}
	bin := buildStockctl(t)
	script, err := filepath.Abs(filepath.Join("..", "scripts", "deploy-recipe.sh"))
	if err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, 11)
	ctx, cancel := context.WithTimeout(context.Background(), recipeBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Env = append(os.Environ(),
		"STOCKCTL="+bin, "ETCD="+etcd, "ETCDCTL="+etcdctl, "TMPDIR="+t.TempDir(),
		fmt.Sprintf("ETCD_PORT=%d", ports[0]), fmt.Sprintf("ETCD_PEER_PORT=%d", ports[1]),
		fmt.Sprintf("API_PORT=%d", ports[2]), fmt.Sprintf("LB_PORT=%d", ports[3]),
		fmt.Sprintf("LB_STATS_PORT=%d", ports[4]),
		fmt.Sprintf("ETCD_PORT_2=%d", ports[5]), fmt.Sprintf("ETCD_PORT_3=%d", ports[6]),
		fmt.Sprintf("ETCD_PEER_PORT_2=%d", ports[7]), fmt.Sprintf("ETCD_PEER_PORT_3=%d", ports[8]),
		fmt.Sprintf("ETCD_B_PORT=%d", ports[9]), fmt.Sprintf("ETCD_B_PEER_PORT=%d", ports[10]),
		"SALE_ORDERS=120",
		// The recipe sets its own; the caller's must not leak in.
		"STOCKCTL_ENDPOINTS=", "STOCKCTL_CLUSTERS=", "STOCKCTL_USER=", "STOCKCTL_PREFIX=",
		"STOCKCTL_CACERT=", "STOCKCTL_CERT=", "STOCKCTL_KEY=", "KEEP=")
	// SIGTERM at the bound lets the script's trap stop etcd and serve.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 20 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/deploy-recipe.sh failed (%v, within %s):\n%s", err, recipeBound, out)
	}
	for _, want := range []string{"SERVING_STATUS_SERVING", "AUDIT      ok", "reclaim needs etcd's root user", "COMPACTED",
		"sale: 120 of 120 orders acknowledged through the API", "is back", "CHECK      total 121 = pool 0 + segments 0 + allocated 121",
		"cannot be removed: 1 SKU(s) placed in it: tablet", "FEED END", "east-2 removed and stopped", "the recipe ran"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the recipe's output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("%s", out)
}

// lookAny returns the first of names that is an executable, or "".
func lookAny(names ...string) string {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return ""
}

// freePorts returns n distinct loopback ports free a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// TestDeployDocMatchesRecipe: the commands docs/deploy.md quotes from
// scripts/deploy-recipe.sh (its blocks between "# <recipe:NAME>" and
// "# </recipe:NAME>", and HAProxy's health check lines) are the script's, so
// the page shows what TestDeployRecipe runs.
func TestDeployDocMatchesRecipe(t *testing.T) {
	script, err := os.ReadFile(filepath.Join("..", "scripts", "deploy-recipe.sh"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string][]string{}
	var open string
	for _, line := range strings.Split(string(script), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "# <recipe:"):
			open = strings.TrimSuffix(strings.TrimPrefix(trimmed, "# <recipe:"), ">")
		case strings.HasPrefix(trimmed, "# </recipe:"):
			open = ""
		case open != "":
			blocks[open] = append(blocks[open], line)
		}
	}
	for _, name := range []string{"certs", "etcd", "users", "reclaim", "serve"} {
		b := strings.Join(blocks[name], "\n")
		if b == "" {
			t.Errorf("scripts/deploy-recipe.sh has no block <recipe:%s>", name)
			continue
		}
		if !strings.Contains(string(doc), "\n"+b+"\n```\n") {
			t.Errorf("docs/deploy.md does not quote the script's block <recipe:%s> as it is:\n%s", name, b)
		}
	}
	checks := 0
	for _, line := range blocks["haproxy"] {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "option httpchk") || strings.HasPrefix(l, "http-check") {
			checks++
			if !strings.Contains(string(doc), "    "+l+"\n") {
				t.Errorf("docs/deploy.md's HAProxy example lacks the script's %q", l)
			}
		}
	}
	if checks < 3 {
		t.Errorf("the script's HAProxy block has %d health check lines, want 3", checks)
	}
	if strings.Contains(string(doc), "option tcp-check\n    server") {
		t.Error("docs/deploy.md's HAProxy example still checks TCP only")
	}
}

package cli

import (
	"strings"
	"testing"

	"github.com/stockctl/stockctl/internal/embedetcd"
	"github.com/stockctl/stockctl/internal/testpki"
)

// Invariant (issue 19, item 6): --prefix /shop (no trailing slash, by flag
// or STOCKCTL_PREFIX) is /shop/, the prefix every key goes under, so a
// role limited to /shop/ is enough for it, the connection check included.
// And `lock`'s CMD, run with the user's password in STOCKCTL_USER, does not
// get it.
func TestPrefixWithoutSlashUnderARole(t *testing.T) {
	p := testpki.New(t)
	srv, err := embedetcd.Start(t.Context(), embedetcd.Config{Dir: t.TempDir(), UnsafeNoFsync: true,
		CertFile: p.ServerCert, KeyFile: p.ServerKey, TrustedCAFile: p.CA, ClientCertAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ep := srv.Endpoints()[0]
	setupAuth(t, ep, p) // the role "shop" may read and write /shop/ only

	conn := []string{"--endpoints", ep, "--cacert", p.CA, "--cert", p.ClientCert, "--key", p.ClientKey, "--dial-timeout", "20s", "--user", "shop:s3cret-pw"}
	for _, args := range [][]string{
		{"--prefix", "/shop", "init", "tee", "--total", "10", "--segments", "2"},
		{"--prefix", "/shop", "allocate", "tee", "--order", "o1", "--qty", "2"},
		{"--prefix", "/shop", "restock", "tee", "--delivery", "dn-1", "--qty", "5"},
		{"--prefix", "/shop", "rebalance", "tee"},
		{"--prefix", "/shop", "lock", "nightly", "--", "true"},
		{"--prefix", "/shop/", "audit", "tee"}, // the same keys, spelt with the slash
	} {
		if r := run(t, append(conn, args...)...); r.code != 0 {
			t.Fatalf("%v as shop: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	var st statusView
	decode(t, run(t, append(conn, "--prefix", "/shop", "-o", "json", "status", "tee")...).stdout, &st)
	if st.Total != 15 || st.Allocated != 2 {
		t.Fatalf("status under /shop: %+v, want what was done under /shop/", st)
	}

	// The environment spelling, and the password kept from CMD.
	t.Setenv("STOCKCTL_PREFIX", "/shop")
	t.Setenv(envUser, "shop:s3cret-pw")
	r := run(t, "--endpoints", ep, "--cacert", p.CA, "--cert", p.ClientCert, "--key", p.ClientKey, "--dial-timeout", "20s",
		"lock", "nightly", "--", "sh", "-c", `echo "user=${STOCKCTL_USER-unset} key=$STOCKCTL_LOCK_KEY"; env`)
	if r.code != 0 {
		t.Fatalf("lock with STOCKCTL_PREFIX=/shop: exit %d, stderr %q", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "user=unset key=/shop/locks/nightly/") || strings.Contains(r.stdout, "s3cret-pw") {
		t.Fatalf("CMD's output %q: want no STOCKCTL_USER and no password anywhere in its environment, and a key under /shop/", r.stdout)
	}
}

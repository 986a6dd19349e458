package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stockctl/stockctl/internal/embedetcd"
	"github.com/stockctl/stockctl/internal/testpki"
)

// setupAuth creates root and a user "shop" whose role may read and write
// only under /shop/, and turns authentication on.
func setupAuth(t *testing.T, endpoint string, p testpki.PKI) {
	t.Helper()
	tc, err := transport.TLSInfo{TrustedCAFile: p.CA, CertFile: p.ClientCert, KeyFile: p.ClientKey}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tc, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := c.RoleAdd(ctx, "root"); return err },
		func() error { _, err := c.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := c.RoleAdd(ctx, "shop"); return err },
		func() error {
			_, err := c.RoleGrantPermission(ctx, "shop", "/shop/", clientv3.GetPrefixRangeEnd("/shop/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := c.UserAdd(ctx, "shop", "s3cret-pw"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "shop", "shop"); return err },
		func() error { _, err := c.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth setup step %d: %v", i, err)
		}
	}
}

// stockctl over TLS with a client certificate, as an etcd user whose role
// is limited to the prefix; the password never shows.
func TestTLSAndAuth(t *testing.T) {
	t.Parallel()
	p := testpki.New(t)
	srv, err := embedetcd.Start(t.Context(), embedetcd.Config{Dir: t.TempDir(), UnsafeNoFsync: true,
		CertFile: p.ServerCert, KeyFile: p.ServerKey, TrustedCAFile: p.CA, ClientCertAuth: true, BcryptCost: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ep := srv.Endpoints()[0]
	setupAuth(t, ep, p)

	conn := []string{"--endpoints", ep, "--cacert", p.CA, "--cert", p.ClientCert, "--key", p.ClientKey, "--dial-timeout", "20s"}
	as := func(user, prefix string, args ...string) result {
		return run(t, append(append(conn, "--user", user, "--prefix", prefix), args...)...)
	}
	for _, args := range [][]string{
		{"init", "iphone", "--total", "20", "--segments", "2", "--initial-fill", "4", "--low-watermark", "2"},
		{"allocate", "iphone", "--order", "o1", "--qty", "2", "--route-key", "u"},
		{"rebalance", "iphone"},
		{"status", "iphone"},
		{"audit", "iphone"},
		{"lock", "nightly", "--", "true"},
		{"release", "iphone", "--order", "o1"},
	} {
		if r := as("shop:s3cret-pw", "/shop/", args...); r.code != 0 {
			t.Fatalf("%v as shop: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	var st statusView
	decode(t, as("shop:s3cret-pw", "/shop/", "-o", "json", "status", "iphone").stdout, &st)
	if st.Allocated != 0 || st.Rebalancer == nil {
		t.Fatalf("status: %+v", st)
	}

	// Outside its prefix the user is refused: exit 1, and the message says why.
	r := as("shop:s3cret-pw", "/other/", "status", "iphone")
	checkFails(t, r, ExitFailure, "permission denied", nil)
	if strings.Contains(r.stderr, "s3cret-pw") {
		t.Fatalf("stderr shows the password: %q", r.stderr)
	}
	// A wrong password.
	r = as("shop:wrong-pw", "/shop/", "status", "iphone")
	checkFails(t, r, ExitFailure, "authentication failed", nil)
	if strings.Contains(r.stderr, "wrong-pw") {
		t.Fatalf("stderr shows the password: %q", r.stderr)
	}
	// Without a client certificate the TLS handshake fails.
	r = run(t, "--endpoints", ep, "--cacert", p.CA, "--user", "shop:s3cret-pw", "--prefix", "/shop/", "--dial-timeout", "1s", "status", "iphone")
	checkFails(t, r, ExitFailure, "failed to", nil)
	if strings.Contains(r.stderr, "s3cret-pw") {
		t.Fatalf("stderr shows the password: %q", r.stderr)
	}
}

package cli

import (
	"io"
	"slices"
	"strings"
	"testing"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/internal/embedetcd"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/testpki"
)

// globalsOf reads the global flags in args the way every command does.
func globalsOf(t *testing.T, args ...string) (*globals, error) {
	t.Helper()
	var g *globals
	var err error
	app := &ucli.App{
		Flags:     globalFlags(),
		Writer:    io.Discard,
		ErrWriter: io.Discard,
		Action: func(c *ucli.Context) error {
			g, err = readGlobals(c)
			return nil
		},
	}
	if rerr := app.Run(append([]string{"stockctl"}, args...)); rerr != nil {
		t.Fatalf("parse %q: %v", args, rerr)
	}
	return g, err
}

// --endpoints takes what etcdctl takes: host:port, which is https with TLS
// files and http without, or an http:// or https:// URL of a host and port.
func TestEndpointsAccepted(t *testing.T) {
	t.Parallel()
	ca := testpki.New(t).CA
	for _, tc := range []struct {
		name    string
		args    []string
		want    []string
		wantTLS bool
	}{
		{"bare ip", []string{"--endpoints", "127.0.0.1:2379"}, []string{"http://127.0.0.1:2379"}, false},
		{"bare name", []string{"--endpoints", "etcd-1.example.com:2379"}, []string{"http://etcd-1.example.com:2379"}, false},
		{"bare ipv6", []string{"--endpoints", "[::1]:2379"}, []string{"http://[::1]:2379"}, false},
		{"http url", []string{"--endpoints", "http://10.0.0.1:2379"}, []string{"http://10.0.0.1:2379"}, false},
		{"scheme in capitals", []string{"--endpoints", "HTTP://10.0.0.1:2379"}, []string{"http://10.0.0.1:2379"}, false},
		{"trailing slash", []string{"--endpoints", "http://10.0.0.1:2379/"}, []string{"http://10.0.0.1:2379"}, false},
		{"https url, system roots", []string{"--endpoints", "https://etcd-1:2379"}, []string{"https://etcd-1:2379"}, true},
		{"list with spaces and an empty entry", []string{"--endpoints", " a:1 , http://b:2 ,"}, []string{"http://a:1", "http://b:2"}, false},
		{"bare with --cacert is https", []string{"--endpoints", "127.0.0.1:2379", "--cacert", ca}, []string{"https://127.0.0.1:2379"}, true},
		{"bare and https mixed", []string{"--endpoints", "a:1,https://b:2"}, []string{"http://a:1", "https://b:2"}, true},
		{"explicit http stays http with --cacert", []string{"--endpoints", "http://a:1", "--cacert", ca}, []string{"http://a:1"}, true},
		{"none", nil, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := globalsOf(t, tc.args...)
			if err != nil {
				t.Fatalf("%q: %v", tc.args, err)
			}
			if !slices.Equal(g.endpoints, tc.want) {
				t.Fatalf("%q: endpoints %q, want %q", tc.args, g.endpoints, tc.want)
			}
			if (g.tls != nil) != tc.wantTLS {
				t.Fatalf("%q: TLS config %v, want TLS %v", tc.args, g.tls, tc.wantTLS)
			}
		})
	}
}

// Invariant: anything but host:port and http(s)://host:port is a usage
// error that names the entry and the forms accepted, and never shows a
// password.
func TestEndpointsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ entry, shown, why string }{
		{"127.0.0.1", "127.0.0.1", "missing port"},
		{"http://10.0.0.1", "http://10.0.0.1", "missing port"},
		{":2379", ":2379", "no host"},
		{"http://:2379", "http://:2379", "no host"},
		{"http://", "http://", "missing port"},
		{"etcd:0", "etcd:0", `port "0" is not a number from 1 to 65535`},
		{"etcd:65536", "etcd:65536", `port "65536"`},
		{"etcd:", "etcd:", `port ""`},
		{"etcd:http", "etcd:http", "invalid port"},
		{"::1:2379", "::1:2379", "an IPv6 address goes in brackets"},
		{"http://fe80::1:2379", "http://fe80::1:2379", "an IPv6 address goes in brackets"},
		{"[::1]", "[::1]", "missing port"},
		{"a b:1", "a b:1", "invalid character"},
		{"ftp://etcd:21", "ftp://etcd:21", `unknown scheme "ftp"`},
		{"unix:///run/etcd.sock", "unix:///run/etcd.sock", `unknown scheme "unix"`},
		{"grpc://etcd:2379", "grpc://etcd:2379", `unknown scheme "grpc"`},
		{"http://etcd:2379/v3", "http://etcd:2379/v3", "without a path"},
		{"etcd:2379/v3", "etcd:2379/v3", "without a path"},
		{"http://etcd:2379?x=1", "http://etcd:2379?x=1", "without a path or query"},
		{"http://root:s3cret@etcd:2379", "http://…@etcd:2379", "use --user"},
		{"root:s3cret@etcd:2379", "…@etcd:2379", "use --user"},
	} {
		t.Run(tc.entry, func(t *testing.T) {
			args := []string{"--endpoints", "ok:1," + tc.entry, "status", "shoe"}
			r := run(t, args...)
			checkFails(t, r, ExitUsage, `invalid --endpoints entry "`+tc.shown+`"`, args)
			for _, want := range []string{tc.why, "want host:port, http://host:port or https://host:port"} {
				if !strings.Contains(r.stderr, want) {
					t.Fatalf("stderr %q does not say %q", r.stderr, want)
				}
			}
			if strings.Contains(r.stderr, "s3cret") {
				t.Fatalf("stderr shows the password: %q", r.stderr)
			}
		})
	}
}

// A command given a bare host:port reaches etcd over plain http, as
// etcdctl does.
func TestBareEndpointCommand(t *testing.T) {
	t.Parallel()
	bare := strings.TrimPrefix(shared.endpoints, "http://")
	if bare == shared.endpoints {
		t.Fatalf("shared endpoint %q is not http://host:port", shared.endpoints)
	}
	e := newEnv(t)
	runBare(t, bare, e.prefix)

	// A dial failure names the endpoint as it was dialled: with its scheme.
	r := run(t, "--endpoints", "127.0.0.1:1", "--dial-timeout", "300ms", "status", "mug")
	if r.code != ExitFailure || !strings.Contains(r.stderr, "etcd at http://127.0.0.1:1") {
		t.Fatalf("unreachable bare endpoint: exit %d, stderr %q", r.code, r.stderr)
	}
}

// With TLS files, a bare host:port is dialled over TLS: a server that
// only speaks TLS answers.
func TestBareEndpointWithTLSFiles(t *testing.T) {
	t.Parallel()
	p := testpki.New(t)
	srv, err := embedetcd.Start(t.Context(), embedetcd.Config{Dir: t.TempDir(), UnsafeNoFsync: true,
		CertFile: p.ServerCert, KeyFile: p.ServerKey, TrustedCAFile: p.CA, ClientCertAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	bare := strings.TrimPrefix(srv.Endpoints()[0], "https://")
	args := []string{"--endpoints", bare, "--cacert", p.CA, "--cert", p.ClientCert, "--key", p.ClientKey, "--dial-timeout", "20s", "--prefix", "/tls/"}
	for _, cmd := range [][]string{{"init", "cup", "--total", "5", "--segments", "1"}, {"audit", "cup"}} {
		if r := run(t, append(args, cmd...)...); r.code != 0 {
			t.Fatalf("stockctl %s: exit %d, stderr %q", strings.Join(append(args, cmd...), " "), r.code, r.stderr)
		}
	}
}

// The same against a released etcd (Debian's etcd-server 3.4 by default;
// skipped when there is none).
func TestBareEndpointExternalEtcd(t *testing.T) {
	ext := etcdtest.NewExternal(t, etcdtest.WithNoFsync())
	t.Logf("etcd %s", ext.Version())
	runBare(t, strings.TrimPrefix(ext.Endpoints()[0], "http://"), "/bare/")
}

// runBare runs a SKU's life through stockctl with --endpoints bare.
func runBare(t *testing.T, bare, prefix string) {
	t.Helper()
	conn := []string{"--endpoints", bare, "--prefix", prefix}
	for _, args := range [][]string{
		{"init", "mug", "--total", "10", "--segments", "2", "--initial-fill", "4"},
		{"allocate", "mug", "--order", "o1", "--qty", "2", "--route-key", "u"},
		{"audit", "mug"},
		{"release", "mug", "--order", "o1"},
	} {
		if r := run(t, append(conn, args...)...); r.code != 0 {
			t.Fatalf("stockctl --endpoints %s %s: exit %d, stderr %q", bare, strings.Join(args, " "), r.code, r.stderr)
		}
	}
	r := run(t, append(conn, "-o", "json", "status", "mug")...)
	if r.code != 0 {
		t.Fatalf("status: exit %d, stderr %q", r.code, r.stderr)
	}
	var st statusView
	decode(t, r.stdout, &st)
	if st.Total != 10 || st.Allocated != 0 || len(st.Segments) != 2 {
		t.Fatalf("status after allocate and release: %+v", st)
	}
}

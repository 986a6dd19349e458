package service_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/service"
)

// slowBody opens a connection that sends a call's headers announcing a
// body of 100 bytes, and one byte of it; the rest never comes. It is
// closed at cleanup.
func slowBody(t *testing.T, e *env, token string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	auth := ""
	if token != "" {
		auth = "Authorization: Bearer " + token + "\r\n"
	}
	if _, err := fmt.Fprintf(conn, "POST /stockctl.v1.StockService/Status HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: 100\r\n\r\n{", auth); err != nil {
		t.Fatal(err)
	}
	return conn
}

// Issue 28, 5a: 520 connections that send a body of 100 bytes one byte at
// a time (here: one byte, then nothing) held every one of the 512 short
// call slots, and every other caller was refused for as long as they
// stayed open. Bodies are now read before a slot is taken: with the 520
// still sending, other callers are served, over gRPC and Connect/JSON.
func TestSlowBodiesHoldNoSlot(t *testing.T) {
	const slow = 520
	e := newEnv(t, withConfig(func(c *service.Config) { c.BodyTimeout = hangBound }))
	createSKU(t, e.grpcStock(t), &stockctlv1.CreateSKURequest{Sku: "hot", Total: 10, Segments: 1})
	for range slow {
		slowBody(t, e, "")
	}
	waitFor(t, "the slow bodies read", func() bool { return service.BodiesReading(e.srv) == slow })
	served := 0
	for _, p := range []protocol{protocols[0], connectJSON} {
		c := e.stock(t, p)
		for i := range 25 {
			if _, err := c.Status(ctx(t), connect.NewRequest(&stockctlv1.StatusRequest{Sku: "hot"})); err != nil {
				t.Fatalf("%s Status %d beside %d slow bodies: %v", p.name, i, slow, err)
			}
			served++
		}
	}
	t.Logf("%d slow bodies being read, %d Status calls served beside them, 0 refused", service.BodiesReading(e.srv), served)
}

// The bounds of bodies being read, and BodyTimeout: a connection, a
// token, and a body that never comes whole.
func TestSlowBodyBounds(t *testing.T) {
	t.Parallel()
	const tokenA, tokenB = "token-a-0123456789abcdef", "token-b-0123456789abcdef"
	for _, tc := range []struct {
		name string
		cfg  func(*service.Config)
		run  func(t *testing.T, e *env)
	}{
		{"per connection", func(c *service.Config) { c.BodyTimeout = hangBound; c.MaxBodiesPerConn = 4 }, func(t *testing.T, e *env) {
			// HTTP/2: many calls on one connection, each body stalled.
			client := httpClient(t, true, "")
			var pipes []*io.PipeWriter
			t.Cleanup(func() {
				for _, p := range pipes {
					_ = p.Close()
				}
			})
			send := func() chan *http.Response {
				pr, pw := io.Pipe()
				pipes = append(pipes, pw)
				req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, e.url+"/stockctl.v1.StockService/Status", pr)
				req.Header.Set("Content-Type", "application/json")
				res := make(chan *http.Response, 1)
				go func() {
					r, err := client.Do(req)
					if err == nil {
						_, _ = io.Copy(io.Discard, r.Body)
						r.Body.Close()
					}
					res <- r
				}()
				go func() { _, _ = pw.Write([]byte("{")) }()
				return res
			}
			for range 4 {
				send()
			}
			waitFor(t, "4 bodies read on one connection", func() bool { return service.BodiesReading(e.srv) == 4 })
			if r := <-send(); r == nil || r.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("the 5th call on the connection: %v, want 429 OVERLOADED", r)
			}
			// Another connection is served.
			if _, err := e.stock(t, connectJSON).Status(ctx(t), connect.NewRequest(&stockctlv1.StatusRequest{Sku: "hot"})); err != nil {
				t.Fatal(err)
			}
		}},
		{"per token", func(c *service.Config) {
			c.BodyTimeout = hangBound
			c.Tokens = []string{tokenA, tokenB}
			c.MaxInflight = 8 // 4 a token
		}, func(t *testing.T, e *env) {
			for range 4 {
				slowBody(t, e, tokenA)
			}
			waitFor(t, "token A's 4 bodies read", func() bool { return service.BodiesReading(e.srv) == 4 })
			code, we, _ := post(t, e, "/stockctl.v1.StockService/Status", "application/json", "Bearer "+tokenA, []byte(`{"sku":"hot"}`))
			if code != http.StatusTooManyRequests || reasonOf(we) != "OVERLOADED" {
				t.Fatalf("token A's 5th call: %d %v, want 429 OVERLOADED", code, we)
			}
			code, we, _ = post(t, e, "/stockctl.v1.StockService/Status", "application/json", "Bearer "+tokenB, []byte(`{"sku":"hot"}`))
			if code != http.StatusOK {
				t.Fatalf("token B's call: %d %v, want 200", code, we)
			}
		}},
		{"body timeout", func(c *service.Config) { c.BodyTimeout = 200 * time.Millisecond }, func(t *testing.T, e *env) {
			conn := slowBody(t, e, "")
			res, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body) // to EOF: the server closes the connection
			if res.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(body), "did not arrive whole") || !res.Close {
				t.Fatalf("answer %d %q (close %v), want 504 DEADLINE_EXCEEDED and the connection closed", res.StatusCode, body, res.Close)
			}
			if got := counter(t, e, "stockctl_api_rejected_total", "reason", "body_timeout"); got != 1 {
				t.Fatalf("rejected_total{body_timeout} = %v", got)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, withConfig(tc.cfg))
			createSKU(t, e.stock(t, connectJSON), &stockctlv1.CreateSKURequest{Sku: "hot", Total: 10, Segments: 1})
			tc.run(t, e)
		})
	}
}

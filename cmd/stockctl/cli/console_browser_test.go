package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	connectrpc "connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// consoleBound bounds every wait for the console's page to show
// something: generous, only there to turn a hang into a failure on a
// loaded machine. Nothing is asserted about how fast the page is.
const consoleBound = 60 * time.Second

// chromiumPath is the headless browser the console tests drive:
// $STOCKCTL_CHROMIUM, else Debian's chromium on PATH. Without one the test
// skips, saying how to get it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("STOCKCTL_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH (apt-get install -y chromium, or set STOCKCTL_CHROMIUM): the console's browser test needs one")
	return ""
}

// bearerClient is an HTTP/1.1 client that sends token with every request.
type bearerTransport struct {
	token string
	next  http.RoundTripper
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// browser is a headless chromium with one tab.
type browser struct {
	t     *testing.T
	ctx   context.Context
	shots string // where screenshots go
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox, // tests often run as root, where chromium's sandbox refuses to start
		chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1360, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	shots := os.Getenv("STOCKCTL_CONSOLE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	return &browser{t: t, ctx: ctx, shots: shots}
}

func (b *browser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, consoleBound)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression in the page and decodes its
// JSON.stringify'd value into v.
func (b *browser) eval(expr string, v any) error {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string]("JSON.stringify("+expr+")"))
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(s), v)
}

// until polls the page until check accepts the value of expr, and returns
// that value; at consoleBound it fails with the last value seen.
func until[T any](b *browser, what, expr string, check func(T) bool) T {
	b.t.Helper()
	deadline := time.Now().Add(consoleBound)
	var v T
	var last error
	for time.Now().Before(deadline) {
		var got T
		if last = b.eval(expr, &got); last == nil {
			v = got
			if check(got) {
				return got
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.t.Fatalf("the console did not show %s within %v; last seen %+v (%v)", what, consoleBound, v, last)
	return v
}

func (b *browser) screenshot(name string) {
	b.t.Helper()
	b.run("let the page draw", chromedp.Sleep(300*time.Millisecond))
	ctx, cancel := context.WithTimeout(b.ctx, consoleBound)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(b.shots, "console-"+name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", path)
}

// verdictRE is the SKU view's verdict on balanced books.
var verdictRE = regexp.MustCompile(`the books balance at revision (\d+): total ([\d,]+) = pool ([\d,]+) \+ segments ([\d,]+) \+ allocated ([\d,]+) \(([\d,]+) sold, ([\d,]+) reserved\)`)

// parseVerdict reads the figures of the SKU view's verdict on balanced
// books.
func parseVerdict(s string) (a *stockctlv1.AuditResponse, ok bool) {
	m := verdictRE.FindStringSubmatch(s)
	if m == nil {
		return nil, false
	}
	n := make([]int64, len(m)-1)
	for i, f := range m[1:] {
		v, err := strconv.ParseInt(strings.ReplaceAll(f, ",", ""), 10, 64)
		if err != nil {
			return nil, false
		}
		n[i] = v
	}
	a = &stockctlv1.AuditResponse{}
	a.Revision, a.Total, a.Pool, a.Segments, a.Allocated, a.Confirmed, a.Reserved = n[0], n[1], n[2], n[3], n[4], n[5], n[6]
	return a, true
}

func (b *browser) goTo(hash string) {
	b.t.Helper()
	var v string
	if err := b.eval(fmt.Sprintf("location.hash = %q", hash), &v); err != nil {
		b.t.Fatalf("open %s: %v", hash, err)
	}
}

// overviewRow is a row of the console's sale overview.
type overviewRow struct {
	SKU       string `json:"sku"`
	Sold      string `json:"sold"`
	Reserved  string `json:"reserved"`
	Remaining string `json:"remaining"`
	SoldOut   string `json:"soldOut"`
	Refusals  string `json:"refusals"` // refusals in the sparkline's minute
	State     string `json:"state"`
}

const overviewRowsJS = `[...document.querySelectorAll('#ov-rows tr[data-sku]')].map((tr) => ({
	sku: tr.dataset.sku, soldOut: tr.dataset.soldout, refusals: tr.dataset.refusals,
	sold: tr.querySelector('.sold').textContent, reserved: tr.querySelector('.reserved').textContent,
	remaining: tr.querySelector('.remaining').textContent, state: tr.querySelector('.state').textContent }))`

// TestConsoleInBrowser drives the console of a real `stockctl serve
// --console` in a headless chromium while a sale runs through the API:
// a wrong token is refused at sign-in; the overview lists every SKU with
// the figures their audits give; a SKU sold out while the page is open
// shows as sold out; one SKU's view shows its segments and a balanced
// audit; a lock taken by `stockctl lock` shows with its holder; the
// cluster view names the rebalancer; a serve paused for a while (a slow
// API) and a serve restarted under the page make it say "reconnecting",
// then show live figures again. Screenshots of each view go to
// $STOCKCTL_CONSOLE_SCREENSHOTS (or a temporary directory).
func TestConsoleInBrowser(t *testing.T) {
	b := newBrowser(t)
	e := newEnv(t)
	const token = "console-test-token-0123456789"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serveArgs := e.args("serve", "--api-addr", freeAddr(t), "--api-tokens", tokens, "--console", "--identity", "console-serve")
	p := startServeProc(t, serveArgs...)
	api := p.view.API
	httpc := &http.Client{Transport: bearerTransport{token: token, next: http.DefaultTransport}, Timeout: procBound}
	stock := stockctlv1connect.NewStockServiceClient(httpc, api, connectrpc.WithProtoJSON())
	ctx := t.Context()

	skus := map[string]*stockctlv1.CreateSKURequest{
		"flash": {Sku: "flash", Total: 40, Segments: 2, InitialFill: 20},
		// Stock for a minute of the sale's trickle at least, so that a slow
		// machine does not sell them out.
		"tee": {Sku: "tee", Total: 30000, Segments: 4, InitialFill: 400, LowWatermark: 20, RefillBatch: 50},
		"mug": {Sku: "mug", Total: 10000, Segments: 2, InitialFill: 200, LowWatermark: 20, RefillBatch: 40},
		"cap": {Sku: "cap", Total: 10000, Segments: 2, InitialFill: 100},
		// Never sold: listed only by a server with ListSKUs.
		"idle": {Sku: "idle", Total: 10, Segments: 1, InitialFill: 10},
	}
	for _, req := range skus {
		if _, err := stock.CreateSKU(ctx, connectrpc.NewRequest(req)); err != nil {
			t.Fatal(err)
		}
	}
	listReq, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/stockctl.v1.StockService/ListSKUs", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	listReq.Header.Set("Content-Type", "application/json")
	listRes, err := httpc.Do(listReq)
	if err != nil {
		t.Fatal(err)
	}
	listRes.Body.Close()
	hasListSKUs := listRes.StatusCode == http.StatusOK
	t.Logf("the server has ListSKUs: %v (HTTP %d)", hasListSKUs, listRes.StatusCode)
	var orderSeq sync.Mutex
	seq := 0
	nextOrder := func() string {
		orderSeq.Lock()
		defer orderSeq.Unlock()
		seq++
		return "o-" + strconv.Itoa(seq)
	}
	allocate := func(sku string, qty int64) error {
		_, err := stock.Allocate(ctx, connectrpc.NewRequest(&stockctlv1.AllocateRequest{Sku: sku, Order: nextOrder(), Qty: qty, RouteKey: nextOrder()}))
		return err
	}

	// A wrong token: a clear sign-in error, and nothing else shown.
	b.run("open the console", chromedp.Navigate(api+"/console/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.run("sign in with a wrong token", chromedp.SendKeys(chromedp.CSS("#token"), "not-the-token-0123456789"), chromedp.Click(chromedp.CSS(`#signin-form button[type="submit"]`)))
	msg := until(b, "a sign-in error", `document.querySelector('#signin-error').textContent`, func(s string) bool { return strings.Contains(s, "refused this token") })
	if !strings.Contains(msg, "TOKEN_INVALID") {
		t.Errorf("sign-in error %q does not say why", msg)
	}
	var hidden bool
	if err := b.eval(`['#view-overview', '#nav', '#signout'].every((sel) => getComputedStyle(document.querySelector(sel)).display === 'none')`, &hidden); err != nil || !hidden {
		t.Errorf("the views show after a refused sign-in (%v)", err)
	}
	b.screenshot("signin")
	var stored string
	if err := b.eval(`sessionStorage.getItem('stockctl.console.token') || ''`, &stored); err != nil || stored != "" {
		t.Errorf("a refused token is kept in sessionStorage: %q %v", stored, err)
	}

	// The sale: buyers on three SKUs (some reserving), through the API.
	saleCtx, stopSale := context.WithCancel(ctx)
	var sale sync.WaitGroup
	for w, sku := range []string{"tee", "mug", "cap", "tee"} {
		sale.Go(func() {
			for i := 0; saleCtx.Err() == nil; i++ {
				var err error
				if sku == "mug" && i%5 == 0 {
					_, err = stock.Reserve(saleCtx, connectrpc.NewRequest(&stockctlv1.ReserveRequest{Sku: sku, Order: nextOrder(), Qty: 1, Ttl: durationpb.New(10 * time.Minute)}))
				} else {
					err = allocate(sku, int64(1+(i+w)%3))
				}
				if err != nil && saleCtx.Err() == nil {
					t.Errorf("order of %s: %v", sku, err)
					return
				}
				time.Sleep(20 * time.Millisecond) // a steady trickle, not a benchmark
			}
		})
	}
	t.Cleanup(func() { stopSale(); sale.Wait() })

	// The right token: the overview.
	b.run("sign in", chromedp.SetValue(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS(`#signin-form button[type="submit"]`)))
	until(b, "the SKUs on sale", overviewRowsJS, func(rows []overviewRow) bool { return len(rows) >= 3 })
	if err := b.eval(`sessionStorage.getItem('stockctl.console.token')`, &stored); err != nil || stored != token {
		t.Errorf("token in sessionStorage: %q %v", stored, err)
	}
	var href string
	if err := b.eval(`location.href`, &href); err != nil || strings.Contains(href, token) {
		t.Errorf("the token is in the page's URL %q (%v)", href, err)
	}

	// A few seconds of sale in the sparklines (by the figures shown, not
	// by the clock).
	until(b, "tee selling", overviewRowsJS, func(rows []overviewRow) bool {
		for _, r := range rows {
			if r.SKU == "tee" {
				n, _ := strconv.Atoi(strings.ReplaceAll(r.Sold, ",", ""))
				return n >= 300
			}
		}
		return false
	})

	// flash sells out while the page is open: it shows as sold out.
	for {
		err := allocate("flash", 3)
		var ce *connectrpc.Error
		if errors.As(err, &ce) && ce.Code() == connectrpc.CodeFailedPrecondition {
			break // insufficient stock: fewer than 3 left
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for allocate("flash", 1) == nil {
	}
	for range 5 { // buyers keep pushing: refusals
		_ = allocate("flash", 1)
	}
	until(b, "flash sold out", overviewRowsJS, func(rows []overviewRow) bool {
		for _, r := range rows {
			if r.SKU == "flash" {
				return r.SoldOut == "true" && strings.HasPrefix(r.State, "sold out") && r.Remaining == "0" && r.Sold == "40" && r.Refusals != "0"
			}
		}
		return false
	})

	// One SKU while it sells: its pool and segments with their levels and
	// holders, its orders as they come, and the audit's verdict. Besides the
	// API's orders (which serve sells without segment locks at this rate),
	// a shop's process holds a segment of tee through its business step.
	shop, err := coordinator.New(shared.client, coordinator.WithPrefix(e.prefix), coordinator.WithIdentity("shop-7"))
	if err != nil {
		t.Fatal(err)
	}
	defer shop.Close()
	inStep, endStep, stepDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := shop.AllocateFunc(ctx, "tee", "shop-order-1", 1, "shop-user", func(context.Context) error {
			close(inStep)
			<-endStep
			return nil
		})
		stepDone <- err
	}()
	<-inStep
	b.goTo("#/sku/tee")
	type skuView struct {
		Places  int
		Holders []string
		Orders  int
		Verdict string
	}
	const skuViewJS = `({places: document.querySelectorAll('#sku-segs tr[data-place]').length,
		holders: [...document.querySelectorAll('#sku-segs .holder')].map((td) => td.textContent).filter((s) => s),
		orders: document.querySelectorAll('#sku-orders li:not(.muted)').length,
		verdict: document.querySelector('#sku-audit').textContent})`
	until(b, "tee selling: pool, 4 segments, a holder, orders, a verdict", skuViewJS, func(v skuView) bool {
		return v.Places == 5 && v.Orders > 0 && strings.Contains(v.Verdict, "the books balance at revision") &&
			slices.ContainsFunc(v.Holders, func(h string) bool { return strings.HasPrefix(h, "shop-7 ") })
	})
	b.screenshot("sku")
	close(endStep)
	if err := <-stepDone; err != nil {
		t.Fatal(err)
	}

	// Stop the sale: the views settle on the audits' figures.
	stopSale()
	sale.Wait()
	audits := map[string]*stockctlv1.AuditResponse{}
	for sku := range skus {
		a, err := stock.Audit(ctx, connectrpc.NewRequest(&stockctlv1.AuditRequest{Sku: sku}))
		if err != nil {
			t.Fatal(err)
		}
		if !a.Msg.Ok {
			t.Fatalf("audit of %s: %v", sku, a.Msg.Problems)
		}
		audits[sku] = a.Msg
	}
	if audits["mug"].Reserved == 0 || audits["tee"].Confirmed == 0 {
		t.Fatalf("the sale sold too little to check: mug reserved %d, tee sold %d", audits["mug"].Reserved, audits["tee"].Confirmed)
	}
	// The view audits every 3 s or ten times as long as its last audit
	// took (on a machine starved enough, longer than the wait below): shown
	// again, it audits at once. Its audit is at a revision no older than
	// the test's; the rebalancer may have moved units between the pool
	// and the segments since (not their sum), nothing else.
	tee := audits["tee"]
	b.goTo("#/")
	b.goTo("#/sku/tee")
	until(b, "tee's final audit", skuViewJS, func(v skuView) bool {
		a, ok := parseVerdict(v.Verdict)
		return ok && a.Revision >= tee.Revision && a.Total == tee.Total && a.Pool+a.Segments == tee.Pool+tee.Segments &&
			a.Allocated == tee.Allocated && a.Confirmed == tee.Confirmed && a.Reserved == tee.Reserved
	})
	b.goTo("#/")
	matches := func(rows []overviewRow) bool {
		seen := 0
		for _, r := range rows {
			a := audits[r.SKU]
			if a == nil {
				continue
			}
			if r.Sold != fmtInt(a.Confirmed) || r.Reserved != fmtInt(a.Reserved) || r.Remaining != fmtInt(a.Pool+a.Segments) {
				return false
			}
			seen++
		}
		return seen == len(audits)
	}
	if !hasListSKUs {
		// The overview lists the SKUs it saw sell, and says why.
		delete(audits, "idle")
		note := until(b, "the overview's note on listing", `document.querySelector('#ov-note').textContent`, func(s string) bool { return s != "" })
		if !strings.Contains(note, "no ListSKUs") {
			t.Errorf("overview note %q", note)
		}
	}
	rows := until(b, "every SKU with its audit's sold, reserved and remaining", overviewRowsJS, matches)
	if !hasListSKUs && slices.ContainsFunc(rows, func(r overviewRow) bool { return r.SKU == "idle" }) {
		t.Errorf("idle listed by a server without ListSKUs: %+v", rows)
	}
	b.screenshot("overview")
	b.run("filter by name", chromedp.SendKeys(chromedp.CSS("#ov-filter"), "te"))
	until(b, "only tee after filtering by \"te\"", overviewRowsJS, func(rows []overviewRow) bool { return len(rows) == 1 && rows[0].SKU == "tee" })

	// 60 more SKUs, each sold once: the overview pages them 50 at a time.
	for i := range 60 {
		sku := fmt.Sprintf("bulk-%02d", i)
		if _, err := stock.CreateSKU(ctx, connectrpc.NewRequest(&stockctlv1.CreateSKURequest{Sku: sku, Total: 5, Segments: 1, InitialFill: 5})); err != nil {
			t.Fatal(err)
		}
		if err := allocate(sku, 1); err != nil {
			t.Fatal(err)
		}
	}
	var typed bool
	if err := b.eval(`(() => { const f = document.querySelector('#ov-filter'); f.value = 'bulk-'; f.dispatchEvent(new Event('input')); return true; })()`, &typed); err != nil {
		t.Fatal(err)
	}
	type pageView struct {
		Count, Page string
		Rows        []overviewRow
	}
	const pageJS = `({count: document.querySelector('#ov-count').textContent, page: document.querySelector('#ov-page').textContent, rows: ` + overviewRowsJS + `})`
	until(b, "the first page of 60 bulk SKUs", pageJS, func(v pageView) bool {
		return v.Count == "60 SKUs matching “bulk-”" && v.Page == "page 1 of 2" && len(v.Rows) == 50
	})
	b.run("next page", chromedp.Click(chromedp.CSS("#ov-next")))
	until(b, "the second page of 60 bulk SKUs", pageJS, func(v pageView) bool {
		return v.Page == "page 2 of 2" && len(v.Rows) == 10 && v.Rows[0].Sold != ""
	})
	var cleared bool
	if err := b.eval(`(() => { const f = document.querySelector('#ov-filter'); f.value = ''; f.dispatchEvent(new Event('input')); return true; })()`, &cleared); err != nil {
		t.Fatalf("clear the filter: %v", err)
	}
	until(b, "the first page of every SKU again", `document.querySelector('#ov-page').textContent`, func(s string) bool { return s == "page 1 of 2" })

	// A SKU that does not exist is said to be missing, not a connection
	// problem.
	b.goTo("#/sku/no-such-sku")
	until(b, "no-such-sku missing, the connection live", `({rev: document.querySelector('#sku-rev').textContent, conn: document.querySelector('#conn').dataset.state,
		places: document.querySelectorAll('#sku-segs tr').length})`,
		func(v struct {
			Rev, Conn string
			Places    int
		}) bool {
			return strings.HasPrefix(v.Rev, "no such SKU") && v.Conn == "live" && v.Places == 0 // nothing left of tee's view
		})

	// A lock taken by the CLI shows with its holder's identity and fencing
	// token, and a second CLI waiting for it as its waiter.
	startLock := func(identity, script string) *syncBuffer {
		cmd := exec.Command(stockctlBinary(t), e.args("--identity", identity, "lock", "console-lock", "--", "sh", "-c", script)...)
		out := &syncBuffer{}
		cmd.Stdout = out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM) // stockctl lock stops its command and releases, or stops waiting
			select {
			case <-done:
			case <-time.After(procBound):
				_ = cmd.Process.Kill()
			}
		})
		return out
	}
	lockOut := startLock("cli-holder", `echo "$STOCKCTL_FENCING_TOKEN"; exec sleep 600`)
	etcdtest.WaitFor(t, "stockctl lock to run its command", procBound, func() bool { return strings.HasSuffix(lockOut.String(), "\n") })
	lockToken := strings.TrimSpace(lockOut.String())
	startLock("cli-waiter", "exec sleep 600")
	b.goTo("#/locks")
	type lockRow struct{ Name, State, Identity, Lease, Token string }
	until(b, "console-lock held by cli-holder, cli-waiter waiting", `[...document.querySelectorAll('#locks-rows tr[data-lock]')].map((tr) => ({
		Name: tr.dataset.lock, State: tr.dataset.state, Identity: tr.querySelector('.identity').textContent,
		Lease: tr.querySelector('.lease').textContent, Token: tr.querySelector('.token').textContent }))`, func(rows []lockRow) bool {
		var held, waits bool
		for _, r := range rows {
			held = held || r.Name == "console-lock" && r.State == "holds" && r.Identity == "cli-holder" && r.Lease != "" && r.Token == lockToken
			waits = waits || r.Name == "console-lock" && r.State == "waits" && r.Identity == "cli-waiter"
		}
		return held && waits
	})
	b.screenshot("locks")

	// The cluster: the member, and this serve as the rebalancer.
	b.goTo("#/cluster")
	until(b, "the etcd member and the rebalancer", `({members: document.querySelectorAll('#cluster-members tr').length,
		rebalancer: document.querySelector('#cluster-cards [data-k="rebalancer"] .v')?.textContent || ''})`, func(v struct {
		Members    int
		Rebalancer string
	}) bool {
		return v.Members >= 1 && strings.HasPrefix(v.Rebalancer, "console-serve")
	})
	b.screenshot("cluster")

	// serve restarts under the page: "reconnecting", then live figures.
	b.goTo("#/")
	until(b, "the overview live", `document.querySelector('#conn').dataset.state`, func(s string) bool { return s == "live" })
	// serve paused (SIGSTOP): a slow API, whose calls go unanswered; the
	// page says "reconnecting", and "live" again once serve goes on.
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }) // before its SIGTERM, should the test fail here
	until(b, `"reconnecting" while serve is paused`, `document.querySelector('#conn').textContent`, func(s string) bool { return strings.HasPrefix(s, "reconnecting") })
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	until(b, "the overview live after the pause", `document.querySelector('#conn').dataset.state`, func(s string) bool { return s == "live" })

	if code := p.term(); code != 0 {
		t.Fatalf("serve exited %d when interrupted; stderr:\n%s", code, p.errOut.String())
	}
	until(b, `"reconnecting"`, `document.querySelector('#conn').textContent`, func(s string) bool { return strings.HasPrefix(s, "reconnecting") })
	b.screenshot("reconnecting")
	startServeProc(t, serveArgs...)
	for range 7 {
		if err := allocate("cap", 2); err != nil {
			t.Fatal(err)
		}
	}
	a, err := stock.Audit(ctx, connectrpc.NewRequest(&stockctlv1.AuditRequest{Sku: "cap"}))
	if err != nil {
		t.Fatal(err)
	}
	until(b, "cap's figures after the restart, live", `({conn: document.querySelector('#conn').dataset.state, rows: `+overviewRowsJS+`})`, func(v struct {
		Conn string
		Rows []overviewRow
	}) bool {
		for _, r := range v.Rows {
			if r.SKU == "cap" {
				return v.Conn == "live" && r.Sold == fmtInt(a.Msg.Confirmed) && r.Remaining == fmtInt(a.Msg.Pool+a.Msg.Segments)
			}
		}
		return false
	})
}

// fmtInt is n as the console prints it (en-US digit grouping).
func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

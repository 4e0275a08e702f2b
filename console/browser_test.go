package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go/jetstream"

	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/natstest"
)

// The browser tests drive Debian's headless Chromium (apt-get install
// chromium) with chromedp. They skip without it, and fail when CI is set
// (.ci/run installs it). With RINGFENCE_SCREENSHOTS=1 they write their
// screenshots to docs/console/ (the README shows them); otherwise to a
// temporary directory.

// browserStep bounds one browser step (a navigation, a wait for the page
// to show something).
const browserStep = 60 * time.Second

type browser struct {
	t       *testing.T
	ctx     context.Context
	dialogs atomic.Int64 // JavaScript dialogs opened (alert, confirm, prompt)
	shots   string
}

func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium not found (CI is set: .ci/run installs Debian's chromium)")
	}
	t.Skip("chromium not found: apt-get install chromium to run the browser tests")
	return ""
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // root in CI
		chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	b := &browser{t: t, ctx: ctx, shots: t.TempDir()}
	if os.Getenv("RINGFENCE_SCREENSHOTS") == "1" {
		b.shots = filepath.Join("..", "docs", "console")
		if err := os.MkdirAll(b.shots, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Count every dialog a script opens, and close it so that the page
	// goes on: a hostile key that ran would show here.
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			b.dialogs.Add(1)
			t.Logf("dialog opened: %q", ev.Message)
			chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	return b
}

// do runs steps within browserStep.
func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserStep)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("browser: %s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserStep)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("browser: evaluate %s: %v", expr, err)
	}
	return v
}

// until waits (within browserStep) for a JavaScript expression to hold.
func (b *browser) until(what, expr string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserStep)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		b.t.Fatalf("browser: waiting for %s: %v", what, err)
	}
}

// shot saves a screenshot of the whole page as name.png.
func (b *browser) shot(name string) {
	b.t.Helper()
	b.save(name, chromedp.FullScreenshot(100))
}

// viewShot saves a screenshot of what the window shows as name.png.
func (b *browser) viewShot(name string) {
	b.t.Helper()
	b.save(name, chromedp.CaptureScreenshot())
}

func (b *browser) save(name string, capture chromedp.Action[[]byte]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserStep)
	defer cancel()
	png, err := chromedp.Run(ctx, capture)
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(b.shots, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot %s (%d bytes)", p, len(png))
}

// A demo-like run: five tenants flow on the in-memory broker; one's
// dependency fails for a while. The tenant view, updated live by server-sent
// events (the page is never reloaded), shows the outage tenant parked, then
// recovered.
func TestBrowserTenantView(t *testing.T) {
	b := newBrowser(t)
	con, err := console.New(console.Options{Refresh: 200 * time.Millisecond, Title: "ringfence console (test)"})
	if err != nil {
		t.Fatal(err)
	}
	srv, e := serveWithTraffic(t, con)
	defer e.stopTraffic()

	b.do("open the tenant view", chromedp.Navigate(srv.URL+"/"))
	eval[bool](b, `(window.__notReloaded = true)`)
	b.until("tenants listed", `document.querySelectorAll('#tenant-rows tr[data-token]').length === 5`)

	e.down.Store("outage", true)
	row := `document.querySelector('#tenant-rows tr[data-token="outage"]')`
	b.until("outage parked", fmt.Sprintf(`(() => { const r = %s; return !!r && r.querySelector('.c-state').textContent === 'open' && Number(r.querySelector('.c-parked').textContent) > 0; })()`, row))
	if first := eval[string](b, `document.querySelector('#tenant-rows tr').dataset.token`); first != "outage" {
		t.Fatalf("the parked tenant is not listed first: %q", first)
	}
	b.until("parked event listed", `[...document.querySelectorAll('#event-list .kind')].some(k => k.textContent.split('/').includes('parked'))`)
	b.shot("tenants-outage")

	e.down.Delete("outage")
	b.until("outage recovered", fmt.Sprintf(`(() => { const r = %s; return !!r && r.querySelector('.c-state').textContent === 'closed' && r.querySelector('.c-parked').textContent === '0' && Number(r.querySelector('.c-handled').textContent) > 0; })()`, row))
	b.until("resumed event listed", `[...document.querySelectorAll('#event-list .kind')].some(k => k.textContent.split('/').includes('resumed'))`)
	b.shot("tenants-recovered")
	if !eval[bool](b, `window.__notReloaded === true`) {
		t.Fatal("the page was reloaded: the live updates did not come from the event stream")
	}
	b.do("open the event log", chromedp.Navigate(srv.URL+"/log"))
	b.until("events listed", `[...document.querySelectorAll('.events .kind')].some(k => k.textContent.split('/').includes('resumed'))`)
	b.shot("log")
	if n := b.dialogs.Load(); n != 0 {
		t.Fatalf("%d dialogs opened", n)
	}
}

// The DLQ browser on a real JetStream DLQ: a tenant whose key is markup is
// shown as text (no script runs), a POST without the token is refused and
// changes nothing, and a record replayed after the dry run leaves the list.
func TestBrowserDLQ(t *testing.T) {
	b := newBrowser(t)
	ns := natstest.Start(t)
	_, js := ns.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	q, err := rfnats.NewDLQ(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	write := func(tenant string, seq uint64, value string, headers ...dlq.Header) {
		t.Helper()
		err := q.Write(ctx, &dlq.Record{
			Tenant: tenant, Key: []byte(tenant), Value: []byte(value), Headers: headers,
			Source: "orders.eu", Offset: -1, Stream: "ORDERS", Sequence: seq, Group: "billing",
			Attempts: 3, FirstFailure: now.Add(-time.Minute), LastFailure: now,
			Error: "payment service: 503 <b>busy</b>", ErrorType: "*errors.errorString", Reason: dlq.ReasonExhausted,
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	write(hostile, 1, `<img src=x onerror=alert(2)>`)
	write(hostile, 2, "order 2 of a hostile tenant", dlq.Header{Key: "trace-<id>", Value: []byte(`"><script>alert(3)</script>`)})
	write("acme", 3, "\x00\x01\x02 binary \xff\xfe order")
	left := func() int {
		t.Helper()
		recs, err := q.Peek(ctx, hostile, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(recs)
	}

	con, err := console.New(console.Options{DLQ: q, Token: testToken, Title: "ringfence console (test)"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	tok := dlq.TenantToken(hostile)

	// A POST without the token: 403, nothing changes.
	hc := client(t)
	r := do(t, hc, "POST", srv.URL+"/dlq/"+tok+"/replay", url.Values{"limit": {"1"}, "dry_run": {"1"}}, nil)
	if r.status != http.StatusForbidden {
		t.Fatalf("POST without token: %d", r.status)
	}
	r = do(t, hc, "POST", srv.URL+"/dlq/"+tok+"/purge", url.Values{"expect": {"0123"}}, nil)
	if r.status != http.StatusForbidden || left() != 2 {
		t.Fatalf("POST purge without token: %d, %d left", r.status, left())
	}

	b.do("sign in", chromedp.Navigate(srv.URL+"/dlq?token="+testToken))
	b.until("signed in, on the DLQ list", `location.search === '' && location.pathname === '/dlq' && !!document.querySelector('#dlq-tenants')`)
	b.until("tenants listed", `document.querySelectorAll('#dlq-tenants tr[data-token]').length === 2`)
	b.shot("dlq-tenants")

	b.do("open the hostile tenant", chromedp.Click(chromedp.CSS(`#dlq-tenants tr[data-token="`+tok+`"] a`)), chromedp.WaitVisible(chromedp.ID("tenant-dlq")))
	b.until("records shown", `document.querySelectorAll('#records article').length === 2`)
	if h := eval[string](b, `document.querySelector('h1').textContent`); !strings.Contains(h, hostile) {
		t.Fatalf("heading %q does not show the key as text", h)
	}
	if k := eval[string](b, `document.querySelector('#records article .record-key').textContent`); k != `"`+hostile+`"` {
		t.Fatalf("key cell %q", k)
	}
	if v := eval[string](b, `document.querySelector('#records article pre.value').textContent`); v != `<img src=x onerror=alert(2)>` {
		t.Fatalf("value %q", v)
	}
	if hd := eval[string](b, `document.querySelector('#records table.headers').textContent`); !strings.Contains(hd, `trace-<id>`) || !strings.Contains(hd, `\"><script>alert(3)</script>`) {
		t.Fatalf("headers %q", hd)
	}
	if n := eval[int](b, `document.scripts.length + document.images.length + document.querySelectorAll('b, i, iframe').length`); n != 0 {
		t.Fatalf("%d script, image or markup elements on the DLQ page", n)
	}
	b.shot("dlq-tenant")

	oldest := eval[string](b, `document.querySelector('#records article').dataset.position`)
	b.do("dry run", chromedp.Click(chromedp.ID("replay-dry")), chromedp.WaitVisible(chromedp.ID("confirm")))
	if c := eval[string](b, `document.getElementById('confirm-count').textContent`); c != "1" {
		t.Fatalf("dry run would move %s", c)
	}
	if p := eval[string](b, `document.querySelector('#records article').dataset.position`); p != oldest || left() != 2 {
		t.Fatalf("dry run shows position %s (want %s), %d left", p, oldest, left())
	}
	b.shot("dlq-confirm")

	b.do("confirm", chromedp.Click(chromedp.ID("confirm-go")), chromedp.WaitVisible(chromedp.ID("tenant-dlq")))
	b.until("flash", `(document.querySelector('.flash') || {}).textContent === 'Replayed 1 dead letter(s) to their source.'`)
	b.until("one record left", `document.querySelectorAll('#records article').length === 1`)
	if p := eval[string](b, `document.querySelector('#records article').dataset.position`); p == oldest {
		t.Fatalf("the replayed record (position %s) is still listed", p)
	}
	if left() != 1 {
		t.Fatalf("%d left in the DLQ, want 1", left())
	}
	st, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("source stream: %v, %+v", err, info)
	}
	b.shot("dlq-replayed")

	// A purge's dry run shows what it would remove; cancelling changes
	// nothing.
	b.do("purge dry run", chromedp.Click(chromedp.ID("purge-dry")), chromedp.WaitVisible(chromedp.ID("confirm")))
	if c := eval[string](b, `document.getElementById('confirm-count').textContent`); c != "1" || left() != 1 {
		t.Fatalf("purge dry run would remove %s, %d left", c, left())
	}
	b.shot("dlq-purge-confirm")
	b.do("cancel", chromedp.Click(chromedp.CSS(`#confirm a`)), chromedp.WaitVisible(chromedp.ID("tenant-dlq")))
	if left() != 1 {
		t.Fatalf("%d left after a cancelled purge", left())
	}

	b.do("binary tenant", chromedp.Navigate(srv.URL+"/dlq/acme"), chromedp.WaitVisible(chromedp.ID("tenant-dlq")))
	b.do("open hex", chromedp.Click(chromedp.CSS(`#records article details summary`)))
	if hx := eval[string](b, `document.querySelector('#records article pre.hex').textContent`); !strings.Contains(hx, "00 01 02 20 62 69 6e 61") {
		t.Fatalf("hex %q", hx)
	}
	b.shot("dlq-binary")
	if n := b.dialogs.Load(); n != 0 {
		t.Fatalf("%d dialogs opened: a hostile key ran", n)
	}
}

// The plots while one tenant is in an outage: the console samples every
// 250ms; the tenant view, refreshed in place, draws the outage tenant's
// goodput and time lag as SVG paths and says since when its breaker is
// open and how old its oldest message is.
func TestBrowserTenantPlots(t *testing.T) {
	b := newBrowser(t)
	con, err := console.New(console.Options{Refresh: 200 * time.Millisecond, HistoryEvery: 250 * time.Millisecond, HistoryPoints: 120, Title: "ringfence console (test)"})
	if err != nil {
		t.Fatal(err)
	}
	srv, e := serveWithTraffic(t, con)
	defer e.stopTraffic()

	b.do("open the tenant view", chromedp.Navigate(srv.URL+"/"))
	eval[bool](b, `(window.__notReloaded = true)`)
	// points counts the segments of a card's plot path.
	points := func(token, plot string) string {
		return fmt.Sprintf(`((p) => p ? (p.getAttribute('d') || '').split(/[ML]/).length - 1 : 0)(document.querySelector('#plots article[data-token="%s"] figure[data-plot="%s"] path.line'))`, token, plot)
	}
	b.until("every tenant plotted", `document.querySelectorAll('#plots article[data-token]').length === 5 && `+points("outage", "goodput")+` >= 20`)

	e.down.Store("outage", true)
	card := `document.querySelector('#plots article[data-token="outage"]')`
	b.until("the outage tenant open and its plots going on", fmt.Sprintf(`(() => { const c = %s; return !!c && c.classList.contains('trouble') && c.querySelector('.state').textContent === 'open' && %s >= 40; })()`, card, points("outage", "goodput")))
	b.until("its breaker open for a few seconds", fmt.Sprintf(`/breaker open for \d+s/.test(%s.querySelector('.since').textContent) && parseInt(%s.querySelector('.open-for b').textContent, 10) >= 6`, card, card))

	if first := eval[string](b, `document.querySelector('#plots article').dataset.token`); first != "outage" {
		t.Fatalf("the tenant in trouble is not plotted first: %q", first)
	}
	for _, plot := range []string{"goodput", "time lag"} {
		if n := eval[int](b, points("outage", plot)); n < 2 {
			t.Fatalf("the outage tenant's %s path has %d points", plot, n)
		}
	}
	since := eval[string](b, card+`.querySelector('.since').textContent`)
	if !regexp.MustCompile(`breaker open for \d+s \(since \d\d:\d\d:\d\d UTC\) · oldest message \d+(ms|s) · oldest parked \d+(ms|s)`).MatchString(since) {
		t.Fatalf("since-when text %q", since)
	}
	if svgs := eval[int](b, card+`.querySelectorAll('svg').length`); svgs != 2 {
		t.Fatalf("%d SVG plots for the outage tenant, want 2", svgs)
	}
	if !eval[bool](b, `window.__notReloaded === true`) {
		t.Fatal("the page was reloaded: the plots were not refreshed in place")
	}
	b.viewShot("tenant-plots")
	if n := b.dialogs.Load(); n != 0 {
		t.Fatalf("%d dialogs opened", n)
	}
}

// trafficRun is an engine behind a served console with traffic running.
type trafficRun struct {
	*engineRun
	stop func()
	done chan struct{}
}

// stopTraffic ends the traffic and waits for its goroutine.
func (r *trafficRun) stopTraffic() { r.stop(); <-r.done }

// serveWithTraffic serves con, starts an engine (4 partitions) feeding it,
// and sends every one of five tenants a message every 10ms, for at most
// 6000 rounds, until stopTraffic.
func serveWithTraffic(t *testing.T, con *console.Console) (*httptest.Server, *trafficRun) {
	t.Helper()
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { con.Close() })
	e := startEngine(t, con, 4)
	tenants := []string{"acme", "globex", "initech", "outage", "umbrella"}
	ctx, stop := context.WithCancel(context.Background())
	r := &trafficRun{engineRun: e, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for i := 0; i < 6000 && ctx.Err() == nil; i++ {
			e.produce(tenants, len(tenants))
			time.Sleep(10 * time.Millisecond) // pacing, not waiting
		}
	}()
	return srv, r
}

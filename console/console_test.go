package console_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
)

const testToken = "test-token-0123456789"

func dlqConsole(t *testing.T, o console.Options) (*memInspector, string) {
	t.Helper()
	in := newMemInspector()
	in.add(hostile, `<img src=x onerror=alert(2)>`, dlq.Header{Key: "x-<b>", Value: []byte("<i>")})
	in.add(hostile, "second")
	in.add("acme", "\x00\x01binary\xff")
	o.DLQ = in
	if o.Token == "" {
		o.Token = testToken
	}
	_, srv := serve(t, o)
	return in, srv.URL
}

func TestNewRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    console.Options
	}{
		{"negative refresh", console.Options{Refresh: -1}},
		{"negative rate", console.Options{ReplayRate: -1}},
		{"negative sampling interval", console.Options{HistoryEvery: -time.Second}},
		{"negative history bound", console.Options{HistoryTenants: -1}},
		{"prefix without slash", console.Options{Prefix: "console"}},
		{"short token", console.Options{Token: "short"}},
		{"token with space", console.Options{Token: "a token with spaces in it"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := console.New(tc.o); !errors.Is(err, console.ErrInvalidOptions) {
				t.Fatalf("New: %v, want ErrInvalidOptions", err)
			}
		})
	}
	c, err := console.New(console.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Token()) < 32 {
		t.Fatalf("generated token %q too short", c.Token())
	}
	d, _ := console.New(console.Options{})
	if d.Token() == c.Token() {
		t.Fatal("two generated tokens are equal")
	}
}

// A POST without the token is refused and changes nothing, whatever else
// it carries; so is a cross-origin one with a valid session.
func TestPostWithoutTokenRefused(t *testing.T) {
	in, base := dlqConsole(t, console.Options{})
	tok := dlq.TenantToken(hostile)
	hc := client(t)
	for _, tc := range []struct {
		name string
		path string
		form url.Values
		hdr  map[string]string
	}{
		{"replay, nothing", "/replay", url.Values{"limit": {"1"}, "expect": {"x"}}, nil},
		{"replay dry run, nothing", "/replay", url.Values{"dry_run": {"1"}}, nil},
		{"purge, nothing", "/purge", url.Values{"expect": {"x"}}, nil},
		{"wrong bearer", "/purge", url.Values{"expect": {"x"}}, map[string]string{"Authorization": "Bearer wrong-token-0123456789"}},
		{"token as a form field", "/replay", url.Values{"token": {testToken}, "expect": {"x"}}, nil},
		{"csrf without session", "/replay", url.Values{"csrf": {"whatever"}, "expect": {"x"}}, nil},
		{"json", "/replay", url.Values{"expect": {"x"}}, map[string]string{"Accept": "application/json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, hc, "POST", base+"/dlq/"+tok+tc.path, tc.form, tc.hdr)
			if r.status != http.StatusForbidden {
				t.Fatalf("status %d, want 403: %s", r.status, r.body)
			}
		})
	}
	if in.changes.Load() != 0 || in.count(hostile) != 2 {
		t.Fatalf("changed: %d actions, %d left", in.changes.Load(), in.count(hostile))
	}
	// GET on an action is not allowed at all.
	if r := do(t, hc, "GET", base+"/dlq/"+tok+"/replay", nil, nil); r.status != http.StatusMethodNotAllowed {
		t.Fatalf("GET replay: %d", r.status)
	}

	// Signed in, with the CSRF field, but sent from another site.
	login(t, hc, base)
	csrf := csrfOf(t, hc, base, tok)
	r := do(t, hc, "POST", base+"/dlq/"+tok+"/replay", url.Values{"csrf": {csrf}, "dry_run": {"1"}}, map[string]string{"Sec-Fetch-Site": "cross-site"})
	if r.status != http.StatusForbidden {
		t.Fatalf("cross-site POST: %d", r.status)
	}
	// Signed in without the CSRF field.
	r = do(t, hc, "POST", base+"/dlq/"+tok+"/replay", url.Values{"dry_run": {"1"}}, nil)
	if r.status != http.StatusForbidden {
		t.Fatalf("POST without csrf: %d", r.status)
	}
	if in.changes.Load() != 0 || in.count(hostile) != 2 {
		t.Fatalf("changed: %d actions", in.changes.Load())
	}
}

// login opens the console with ?token= and checks the redirect drops it.
func login(t *testing.T, hc *http.Client, base string) {
	t.Helper()
	r := do(t, hc, "GET", base+"/dlq?token=wrong-token-0123456789", nil, nil)
	if r.status != http.StatusForbidden {
		t.Fatalf("wrong token: %d", r.status)
	}
	r = do(t, hc, "GET", base+"/dlq?token="+testToken+"&x=1", nil, nil)
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/dlq?x=1" {
		t.Fatalf("login: %d to %q", r.status, r.header.Get("Location"))
	}
	set := r.header.Get("Set-Cookie")
	if strings.Contains(set, testToken) || !strings.Contains(set, "HttpOnly") || !strings.Contains(set, "SameSite=Strict") {
		t.Fatalf("cookie %q", set)
	}
}

// csrfOf reads the CSRF field of a tenant's DLQ page.
func csrfOf(t *testing.T, hc *http.Client, base, tok string) string {
	t.Helper()
	r := do(t, hc, "GET", base+"/dlq/"+tok, nil, nil)
	_, after, ok := strings.Cut(r.body, `name="csrf" value="`)
	if !ok {
		t.Fatalf("no csrf field in the page:\n%s", r.body)
	}
	v, _, _ := strings.Cut(after, `"`)
	return v
}

// The browser flow without a browser: dry run, confirm, gone; a confirm
// whose dry run no longer matches is refused.
func TestReplayDryRunThenConfirm(t *testing.T) {
	in, base := dlqConsole(t, console.Options{})
	tok := dlq.TenantToken(hostile)
	hc := client(t)
	login(t, hc, base)
	csrf := csrfOf(t, hc, base, tok)

	r := do(t, hc, "POST", base+"/dlq/"+tok+"/replay", url.Values{"csrf": {csrf}, "dry_run": {"1"}, "limit": {"1"}}, nil)
	if r.status != http.StatusOK || !strings.Contains(r.body, "Dry run: nothing was changed") {
		t.Fatalf("dry run: %d\n%s", r.status, r.body)
	}
	if in.changes.Load() != 0 {
		t.Fatal("the dry run changed the DLQ")
	}
	_, after, _ := strings.Cut(r.body, `name="expect" value="`)
	expect, _, _ := strings.Cut(after, `"`)

	// Without the dry run's value: refused.
	r = do(t, hc, "POST", base+"/dlq/"+tok+"/replay", url.Values{"csrf": {csrf}, "limit": {"1"}}, nil)
	if r.status != http.StatusBadRequest {
		t.Fatalf("no expect: %d", r.status)
	}
	// A different limit than the dry run's: the set differs, refused.
	r = do(t, hc, "POST", base+"/dlq/"+tok+"/replay", url.Values{"csrf": {csrf}, "limit": {"2"}, "expect": {expect}}, nil)
	if r.status != http.StatusConflict || in.changes.Load() != 0 {
		t.Fatalf("stale expect: %d, %d changes", r.status, in.changes.Load())
	}
	r = do(t, hc, "POST", base+"/dlq/"+tok+"/replay", url.Values{"csrf": {csrf}, "limit": {"1"}, "expect": {expect}}, nil)
	if r.status != http.StatusSeeOther || !strings.Contains(r.header.Get("Location"), "replayed=1") {
		t.Fatalf("confirm: %d %q\n%s", r.status, r.header.Get("Location"), r.body)
	}
	if in.count(hostile) != 1 || len(in.replayed) != 1 || string(in.replayed[0].Value) != `<img src=x onerror=alert(2)>` {
		t.Fatalf("after replay: %d left, replayed %v", in.count(hostile), in.replayed)
	}
	// The same confirmation again: the oldest is another one now.
	r = do(t, hc, "POST", base+"/dlq/"+tok+"/replay", url.Values{"csrf": {csrf}, "limit": {"1"}, "expect": {expect}}, nil)
	if r.status != http.StatusConflict || in.count(hostile) != 1 {
		t.Fatalf("replayed twice: %d", r.status)
	}
}

// The JSON API with a bearer token: the CLI's lines, a confirm line, then
// the move; rate limits answer 429 until the clock allows.
func TestJSONAPIAndRateLimits(t *testing.T) {
	clk := newFakeClock()
	in, base := dlqConsole(t, console.Options{Now: clk.Now, MaxReplay: 2, ReplayRate: 1, PurgeEvery: time.Minute})
	for i := range 4 {
		in.add("acme", "more "+string(rune('a'+i)))
	}
	hc := client(t)
	auth := map[string]string{"Authorization": "Bearer " + testToken, "Accept": "application/json"}
	post := func(path string, form url.Values) resp { return do(t, hc, "POST", base+path, form, auth) }

	ls := lines(t, do(t, hc, "GET", base+"/dlq?format=json", nil, nil).body)
	if len(ls) != 2 || ls[0]["type"] != "tenant" || ls[0]["tenant"].(map[string]any)["key"] != "<script>alert(1)</script>" && ls[1]["tenant"].(map[string]any)["key"] != "<script>alert(1)</script>" {
		t.Fatalf("ls: %v", ls)
	}

	dry := func(limit string) string {
		t.Helper()
		r := post("/dlq/acme/replay", url.Values{"dry_run": {"1"}, "limit": {limit}})
		ls := lines(t, r.body)
		if r.status != 200 || len(ls) < 2 {
			t.Fatalf("dry run: %d %s", r.status, r.body)
		}
		last, replay := ls[len(ls)-1], ls[len(ls)-2]
		if last["type"] != "confirm" || replay["type"] != "replay" || replay["dry_run"] != true {
			t.Fatalf("dry run lines: %v", ls)
		}
		return last["expect"].(string)
	}
	if r := post("/dlq/acme/replay", url.Values{"dry_run": {"1"}, "limit": {"3"}}); r.status != http.StatusBadRequest {
		t.Fatalf("limit past MaxReplay: %d", r.status)
	}
	e := dry("2")
	r := post("/dlq/acme/replay", url.Values{"limit": {"2"}, "expect": {e}})
	ls = lines(t, r.body)
	if r.status != 200 || len(ls) != 3 || ls[2]["type"] != "replay" || ls[2]["moved"] != 2.0 || ls[0]["type"] != "record" {
		t.Fatalf("replay: %d %v", r.status, ls)
	}
	// The bucket (2, refilled at 1/s) is empty: the next is refused.
	e = dry("1")
	r = post("/dlq/acme/replay", url.Values{"limit": {"1"}, "expect": {e}})
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" || in.count("acme") != 3 {
		t.Fatalf("rate limit: %d %q, %d left", r.status, r.header.Get("Retry-After"), in.count("acme"))
	}
	clk.Advance(time.Second)
	if r = post("/dlq/acme/replay", url.Values{"limit": {"1"}, "expect": {e}}); r.status != 200 || in.count("acme") != 2 {
		t.Fatalf("after a second: %d, %d left", r.status, in.count("acme"))
	}

	// Purge: a dry run, then one purge per minute.
	pr := post("/dlq/acme/purge", url.Values{"dry_run": {"1"}})
	pl := lines(t, pr.body)
	if len(pl) != 2 || pl[0]["type"] != "tenant" || pl[0]["count"] != 2.0 || pl[1]["type"] != "confirm" || pl[1]["count"] != 2.0 {
		t.Fatalf("purge dry run: %v", pl)
	}
	r = post("/dlq/acme/purge", url.Values{"expect": {pl[1]["expect"].(string)}})
	if pl = lines(t, r.body); r.status != 200 || pl[0]["type"] != "purge" || pl[0]["purged"] != 2.0 || in.count("acme") != 0 {
		t.Fatalf("purge: %d %v", r.status, pl)
	}
	pl = lines(t, post("/dlq/"+dlq.TenantToken(hostile)+"/purge", url.Values{"dry_run": {"1"}}).body)
	r = post("/dlq/"+dlq.TenantToken(hostile)+"/purge", url.Values{"expect": {pl[1]["expect"].(string)}})
	if r.status != http.StatusTooManyRequests || in.count(hostile) != 2 {
		t.Fatalf("second purge within a minute: %d", r.status)
	}
}

func TestReadOnly(t *testing.T) {
	in, base := dlqConsole(t, console.Options{ReadOnly: true})
	hc := client(t)
	login(t, hc, base)
	tok := dlq.TenantToken(hostile)
	page := do(t, hc, "GET", base+"/dlq/"+tok, nil, nil)
	if page.status != 200 || strings.Contains(page.body, "<form") || !strings.Contains(page.body, "read-only") {
		t.Fatalf("read-only page offers actions:\n%s", page.body)
	}
	r := do(t, hc, "POST", base+"/dlq/"+tok+"/replay", url.Values{"dry_run": {"1"}}, map[string]string{"Authorization": "Bearer " + testToken})
	if r.status != http.StatusForbidden || in.changes.Load() != 0 {
		t.Fatalf("read-only replay: %d", r.status)
	}
}

// A hostile key, header and value are text in the HTML: no markup of
// theirs survives, and the DLQ pages carry no script at all.
func TestHostileKeyEscaped(t *testing.T) {
	_, base := dlqConsole(t, console.Options{})
	hc := client(t)
	for _, path := range []string{"/dlq", "/dlq/" + dlq.TenantToken(hostile), "/dlq/acme"} {
		r := do(t, hc, "GET", base+path, nil, nil)
		if r.status != 200 {
			t.Fatalf("%s: %d", path, r.status)
		}
		for _, bad := range []string{"<script", "<img", "<i>", "<b>"} {
			if strings.Contains(r.body, bad) {
				t.Fatalf("%s contains %q:\n%s", path, bad, r.body)
			}
		}
		if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
			t.Fatalf("CSP %q", csp)
		}
	}
	r := do(t, hc, "GET", base+"/dlq/"+dlq.TenantToken(hostile), nil, nil)
	for _, want := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(2)&gt;", "x-&lt;b&gt;"} {
		if !strings.Contains(r.body, want) {
			t.Fatalf("page lacks %q", want)
		}
	}
	r = do(t, hc, "GET", base+"/dlq/acme", nil, nil)
	if !strings.Contains(r.body, `\x00\x01binary\xff`) || !strings.Contains(r.body, "00 01 62 69 6e 61 72 79  ff") {
		t.Fatalf("binary value not shown as escaped text and hex:\n%s", r.body)
	}
	if r := do(t, hc, "GET", base+"/dlq/not%20a%20token", nil, nil); r.status != http.StatusNotFound {
		t.Fatalf("bad token: %d", r.status)
	}
}

// A loopback console answers loopback names only.
func TestHostCheck(t *testing.T) {
	_, base := dlqConsole(t, console.Options{Hosts: []string{"console.internal"}})
	hc := client(t)
	for host, want := range map[string]int{
		"evil.example:80": http.StatusMisdirectedRequest, "localhost:1": 200, "127.0.0.5": 200, "[::1]:9": 200, "console.internal": 200,
	} {
		req, _ := http.NewRequest("GET", base+"/dlq", nil)
		req.Host = host
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Fatalf("Host %s: %d, want %d", host, res.StatusCode, want)
		}
	}
}

// Many viewers share one snapshot per Refresh.
func TestSnapshotShared(t *testing.T) {
	clk := newFakeClock()
	eng := &countingEngine{stats: consumer.Stats{Totals: consumer.Totals{Handled: 7}, Tenants: []consumer.TenantStats{{Tenant: hostile, State: policy.Open, Parked: 3}}}}
	_, srv := serve(t, console.Options{Engine: eng, Now: clk.Now, Refresh: time.Second})
	hc := client(t)
	for range 20 {
		r := do(t, hc, "GET", srv.URL+"/", nil, nil)
		if r.status != 200 || strings.Contains(r.body, "<script>alert") || !strings.Contains(r.body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Fatalf("tenant view: %d\n%s", r.status, r.body)
		}
	}
	if n := eng.calls.Load(); n != 1 {
		t.Fatalf("%d Stats calls for 20 views within Refresh, want 1", n)
	}
	clk.Advance(time.Second)
	ls := lines(t, do(t, hc, "GET", srv.URL+"/?format=json", nil, nil).body)
	if eng.calls.Load() != 2 || ls[0]["type"] != "stats" || ls[0]["handled"] != 7.0 {
		t.Fatalf("after Refresh: %d calls, %v", eng.calls.Load(), ls)
	}
	ts := ls[0]["tenants"].([]any)[0].(map[string]any)
	if ts["state"] != "open" || ts["parked"] != 3.0 || ts["tenant"].(map[string]any)["token"] != dlq.TenantToken(hostile) {
		t.Fatalf("tenant line %v", ts)
	}
}

// A tenant whose DLQ refuses its dead letters is in trouble, and the view
// and the JSON say the DLQ is why its messages wait.
func TestDLQUnavailableShown(t *testing.T) {
	eng := &countingEngine{stats: consumer.Stats{
		Totals:                consumer.Totals{DLQFailures: 9},
		DLQUnavailableTenants: 1,
		Tenants: []consumer.TenantStats{
			{Tenant: "acme", State: policy.Closed},
			{Tenant: "globex", State: policy.Closed, DLQUnavailable: true, DLQUnavailableFor: time.Minute, DLQFailures: 9, Queued: 40},
		},
	}}
	_, srv := serve(t, console.Options{Engine: eng})
	hc := client(t)
	r := do(t, hc, "GET", srv.URL+"/", nil, nil)
	if r.status != 200 || !strings.Contains(r.body, "0 · dlq-unavailable") {
		t.Fatalf("tenant view: %d\n%s", r.status, r.body)
	}
	if i, j := strings.Index(r.body, `data-token="globex"`), strings.Index(r.body, `data-token="acme"`); i < 0 || j < 0 || i > j {
		t.Fatalf("globex is not first (in trouble): %d, %d", i, j)
	}
	ls := lines(t, do(t, hc, "GET", srv.URL+"/?format=json", nil, nil).body)
	if ls[0]["dlq_unavailable_tenants"] != 1.0 || ls[0]["dlq_failures"] != 9.0 {
		t.Fatalf("stats line %v", ls[0])
	}
	ts := ls[0]["tenants"].([]any)[1].(map[string]any)
	if ts["dlq_unavailable"] != true || ts["dlq_failures"] != 9.0 {
		t.Fatalf("tenant line %v", ts)
	}
}

// The event log keeps the newest lines, drops retries, and renders keys
// as text.
func TestEventLog(t *testing.T) {
	c, srv := serve(t, console.Options{Events: 4})
	c.OnEvent(consumer.Event{Kind: consumer.EventRetried, Tenant: "a"})
	for i := range 6 {
		c.OnEvent(consumer.Event{Kind: consumer.EventParked, Tenant: fmt.Sprint(hostile, i), Partition: consumer.Partition{Topic: "t", ID: int32(i)}})
	}
	hc := client(t)
	ls := lines(t, do(t, hc, "GET", srv.URL+"/log?format=json", nil, nil).body)
	if len(ls) != 4 || ls[0]["seq"] != 3.0 || ls[3]["seq"] != 6.0 || ls[3]["kind"] != "parked" || ls[3]["partition"] != 5.0 {
		t.Fatalf("log: %v", ls)
	}
	page := do(t, hc, "GET", srv.URL+"/log", nil, nil)
	if strings.Contains(page.body, "<script>alert") || !strings.Contains(page.body, "&lt;script&gt;") {
		t.Fatalf("log page:\n%s", page.body)
	}
}

func TestPrefix(t *testing.T) {
	in := newMemInspector()
	in.add("acme", "v")
	c, err := console.New(console.Options{Prefix: "/ops/console/", DLQ: in, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/console/", c)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	hc := client(t)
	r := do(t, hc, "GET", srv.URL+"/ops/console/", nil, nil)
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/ops/console/dlq" {
		t.Fatalf("no engine: %d %q", r.status, r.header.Get("Location"))
	}
	r = do(t, hc, "GET", srv.URL+"/ops/console/dlq/acme", nil, nil)
	if r.status != 200 || !strings.Contains(r.body, `href="/ops/console/static/style.css"`) {
		t.Fatalf("prefixed page: %d\n%s", r.status, r.body)
	}
	r = do(t, hc, "GET", srv.URL+"/ops/console/dlq?token="+testToken, nil, nil)
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/ops/console/dlq" || !strings.Contains(r.header.Get("Set-Cookie"), "Path=/ops/console/") {
		t.Fatalf("prefixed login: %d %q %q", r.status, r.header.Get("Location"), r.header.Get("Set-Cookie"))
	}
	if r = do(t, hc, "GET", srv.URL+"/ops/console/static/live.js", nil, nil); r.status != 200 || !strings.Contains(r.body, "EventSource") {
		t.Fatalf("static: %d", r.status)
	}
}

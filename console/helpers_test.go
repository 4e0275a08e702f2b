package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// hostile is a tenant key that is markup.
const hostile = "<script>alert(1)</script>"

// memInspector is a dlq.Inspector over a map, counting what changed.
type memInspector struct {
	mu       sync.Mutex
	recs     map[string][]dlq.Record // tenant -> oldest first
	replayed []dlq.Record
	purged   int
	changes  atomic.Int64 // replays and purges carried out (not dry runs)
}

func newMemInspector() *memInspector { return &memInspector{recs: map[string][]dlq.Record{}} }

func (m *memInspector) add(tenant string, value string, headers ...dlq.Header) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := int64(0)
	for _, rs := range m.recs {
		n += int64(len(rs))
	}
	at := time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC).Add(time.Duration(n) * time.Second)
	m.recs[tenant] = append(m.recs[tenant], dlq.Record{
		Tenant: tenant, Key: []byte(tenant), Value: []byte(value), Headers: headers,
		Source: "orders", Partition: 0, Offset: 100 + n, Group: "billing", Attempts: 3,
		FirstFailure: at.Add(-time.Second), LastFailure: at, Error: "payment service: 503",
		ErrorType: "*errors.errorString", Reason: dlq.ReasonExhausted, Time: at, Position: n,
	})
}

func (m *memInspector) count(tenant string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.recs[tenant])
}

func (m *memInspector) Tenants(context.Context) ([]dlq.TenantSummary, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []dlq.TenantSummary
	for k, rs := range m.recs {
		if len(rs) == 0 {
			continue
		}
		out = append(out, dlq.TenantSummary{
			Tenant: k, Token: dlq.TenantToken(k), Count: len(rs), Records: len(rs),
			Oldest: rs[0].Time, Newest: rs[len(rs)-1].Time, Reason: rs[0].Reason, LastError: rs[len(rs)-1].Error,
		})
	}
	slices.SortFunc(out, func(a, b dlq.TenantSummary) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out, nil
}

func (m *memInspector) Peek(_ context.Context, tenant string, n int) ([]dlq.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rs := m.recs[tenant]
	if n > 0 && n < len(rs) {
		rs = rs[:n]
	}
	return slices.Clone(rs), nil
}

func (m *memInspector) Replay(_ context.Context, tenant string, opt dlq.ReplayOptions) ([]dlq.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rs := m.recs[tenant]
	n := len(rs)
	if opt.Limit > 0 && opt.Limit < n {
		n = opt.Limit
	}
	moved := slices.Clone(rs[:n])
	if !opt.DryRun {
		m.recs[tenant] = rs[n:]
		m.replayed = append(m.replayed, moved...)
		m.changes.Add(1)
	}
	return moved, nil
}

func (m *memInspector) Purge(_ context.Context, tenant string) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.recs[tenant])
	delete(m.recs, tenant)
	m.purged += n
	m.changes.Add(1)
	return n, nil
}

// countingEngine counts Stats calls.
type countingEngine struct {
	calls atomic.Int64
	stats consumer.Stats
}

func (e *countingEngine) Stats() consumer.Stats {
	e.calls.Add(1)
	return e.stats
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// serve starts the console on a loopback port.
func serve(t *testing.T, o console.Options) (*console.Console, *httptest.Server) {
	t.Helper()
	c, err := console.New(o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	t.Cleanup(func() {
		c.Close()
		srv.Close()
	})
	return c, srv
}

// client is an HTTP client with a cookie jar that does not follow
// redirects.
func client(t *testing.T) *http.Client {
	t.Helper()
	jar := &jar{}
	return &http.Client{
		Jar:           jar,
		Timeout:       20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// jar is a minimal cookie jar (one host).
type jar struct {
	mu sync.Mutex
	cs []*http.Cookie
}

func (j *jar) SetCookies(_ *url.URL, cs []*http.Cookie) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.cs = append(j.cs, cs...)
}

func (j *jar) Cookies(*url.URL) []*http.Cookie {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.cs)
}

type resp struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, c *http.Client, method, u string, form url.Values, hdr map[string]string) resp {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: string(b)}
}

// lines decodes JSON Lines into generic objects.
func lines(t *testing.T, body string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// waitFor polls cond every 10ms until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

package console_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/fleet"
	"github.com/ringfence/ringfence/internal/natstest"
)

func fleetConsole(t *testing.T) (fleet.Store, string) {
	t.Helper()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	st, err := fleet.NewNATSStore(ctx, js, "shop", fleet.NATSOptions{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := fleet.PublishStatus(ctx, st, fleet.Status{Process: "p1", Group: "shop", Source: "kafka", TTL: time.Minute, UpdatedAt: now,
		Partitions: []string{"orders/0"}, Counts: fleet.Counts{Tenants: 2, Unhealthy: 1},
		Tenants: []fleet.TenantStatus{{Tenant: "acme", State: "open", RetryAt: now.Add(time.Minute), Parked: 4}}}); err != nil {
		t.Fatal(err)
	}
	_, hs := serve(t, console.Options{Fleet: st, Token: testToken, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return st, hs.URL
}

func controlOf(t *testing.T, st fleet.Store, tenant string) fleet.ControlRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := fleet.ReadControls(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cs[tenant]
}

// The fleet page shows processes, partition owners and tenants not healthy;
// its buttons write control records only with the token (session and CSRF
// field, or bearer), same-origin, with a reason.
func TestFleetPage(t *testing.T) {
	t.Parallel()
	st, base := fleetConsole(t)
	hc := client(t)
	r := do(t, hc, "GET", base+"/fleet", nil, nil)
	if r.status != http.StatusOK || !strings.Contains(r.body, `data-process="p1"`) || !strings.Contains(r.body, `data-token="acme"`) || !strings.Contains(r.body, "orders/0") {
		t.Fatalf("fleet page: %d\n%s", r.status, r.body)
	}
	if strings.Contains(r.body, `name="verb"`) {
		t.Fatal("control buttons shown without a session")
	}
	types := map[string]int{}
	for _, l := range lines(t, do(t, hc, "GET", base+"/fleet?format=json", nil, nil).body) {
		types[l["type"].(string)]++
	}
	if types["process"] != 1 || types["partition"] != 1 || types["tenant"] != 1 {
		t.Fatalf("fleet JSON line types %v", types)
	}

	hold := url.Values{"verb": {"hold"}, "tenant_token": {"acme"}, "reason": {"incident 42"}}
	if r := do(t, hc, "POST", base+"/fleet/control", hold, nil); r.status != http.StatusForbidden {
		t.Fatalf("POST without the token: %d", r.status)
	}
	if c := controlOf(t, st, "acme"); c.Active() {
		t.Fatalf("control written without the token: %+v", c)
	}
	r = do(t, hc, "GET", base+"/fleet?token="+testToken, nil, nil)
	if r.status != http.StatusSeeOther {
		t.Fatalf("login: %d", r.status)
	}
	page := do(t, hc, "GET", base+"/fleet", nil, nil).body
	_, after, ok := strings.Cut(page, `name="csrf" value="`)
	if !ok || !strings.Contains(page, `value="hold"`) {
		t.Fatalf("no control form when signed in:\n%s", page)
	}
	csrf, _, _ := strings.Cut(after, `"`)
	hold.Set("csrf", csrf)
	if r := do(t, hc, "POST", base+"/fleet/control", hold, map[string]string{"Sec-Fetch-Site": "cross-site"}); r.status != http.StatusForbidden {
		t.Fatalf("cross-site POST: %d", r.status)
	}
	for _, bad := range []url.Values{
		{"csrf": {csrf}, "verb": {"hold"}, "tenant_token": {"acme"}},
		{"csrf": {csrf}, "verb": {"explode"}, "tenant_token": {"acme"}, "reason": {"x"}},
		{"csrf": {csrf}, "verb": {"hold"}, "tenant_token": {"a_zz"}, "reason": {"x"}},
	} {
		if r := do(t, hc, "POST", base+"/fleet/control", bad, nil); r.status != http.StatusBadRequest {
			t.Fatalf("POST %v: %d, want 400", bad, r.status)
		}
	}
	r = do(t, hc, "POST", base+"/fleet/control", hold, nil)
	if r.status != http.StatusSeeOther {
		t.Fatalf("hold: %d %s", r.status, r.body)
	}
	if c := controlOf(t, st, "acme"); !c.Hold || c.Reason != "incident 42" || !strings.HasPrefix(c.By, "console") {
		t.Fatalf("control after hold: %+v", c)
	}
	page = do(t, hc, "GET", base+"/fleet", nil, nil).body
	if !strings.Contains(page, `<td class="c-control">hold</td>`) {
		t.Fatalf("the hold is not shown:\n%s", page)
	}
	// Bearer, JSON: open the breaker, then release; the hold goes, the
	// breaker stays forced.
	for _, verb := range []string{"open", "release"} {
		r = do(t, &http.Client{}, "POST", base+"/fleet/control", url.Values{"verb": {verb}, "tenant": {"acme"}, "reason": {"fixed"}},
			map[string]string{"Authorization": "Bearer " + testToken, "Accept": "application/json"})
		if r.status != http.StatusOK {
			t.Fatalf("%s with bearer: %d %s", verb, r.status, r.body)
		}
	}
	if c := controlOf(t, st, "acme"); c.Hold || c.Breaker != "open" || c.Reason != "fixed" {
		t.Fatalf("control after open and release: %+v", c)
	}
}

package console_test

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/policy"
)

// stubEngine answers Stats with tenants a test sets.
type stubEngine struct {
	mu      sync.Mutex
	tenants []consumer.TenantStats
}

func (e *stubEngine) Stats() consumer.Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return consumer.Stats{Tenants: slices.Clone(e.tenants)}
}

// update changes the tenants in place.
func (e *stubEngine) update(f func(t *consumer.TenantStats)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := range e.tenants {
		f(&e.tenants[i])
	}
}

func (e *stubEngine) drop(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tenants = slices.DeleteFunc(e.tenants, func(t consumer.TenantStats) bool { return t.Tenant == key })
}

// plotsOf reads GET /plots as JSON: tenant key -> goodput of its points.
func plotsOf(t *testing.T, url string) map[string][]float64 {
	t.Helper()
	out := map[string][]float64{}
	for _, l := range lines(t, do(t, client(t), "GET", url+"/plots?format=json", nil, nil).body) {
		if l["type"] != "plot" {
			t.Fatalf("line %v", l)
		}
		gp := []float64{}
		for _, p := range l["points"].([]any) {
			gp = append(gp, p.(map[string]any)["goodput"].(float64))
		}
		out[l["tenant"].(map[string]any)["key"].(string)] = gp
	}
	return out
}

// The console keeps plots for at most HistoryTenants tenants, those worth
// watching: the busiest while all are calm, a tenant in trouble in place
// of a calm one; a tenant the engine forgets loses its plot, and each
// plot keeps HistoryPoints samples.
func TestPlotsWatchABoundedSet(t *testing.T) {
	clk := newFakeClock()
	eng := &stubEngine{}
	for i := range 200 {
		eng.tenants = append(eng.tenants, consumer.TenantStats{Tenant: fmt.Sprintf("t%03d", i), Handled: uint64(i)})
	}
	c, srv := serve(t, console.Options{Engine: eng, Now: clk.Now, Refresh: time.Second, HistoryEvery: 2 * time.Second, HistoryTenants: 3, HistoryPoints: 4})
	every := 2 * time.Second
	// The engine moves on, then the clock: whether the sampler's own tick
	// or Sample takes the snapshot, it is one sample of the same values.
	tick := func(handled uint64) {
		eng.update(func(t *consumer.TenantStats) {
			if t.State == policy.Closed {
				t.Handled += handled
			}
		})
		clk.Advance(every)
		c.Sample()
	}
	c.Sample()
	if got := plotsOf(t, srv.URL); len(got) != 3 || got["t199"] == nil || got["t198"] == nil || got["t197"] == nil || len(got["t199"]) != 0 {
		t.Fatalf("after the first sample: %v (want the three busiest, no points yet)", got)
	}
	tick(20)
	if got := plotsOf(t, srv.URL); len(got) != 3 || !slices.Equal(got["t199"], []float64{10}) {
		t.Fatalf("goodput: %v, want 10/s for t199", got)
	}

	eng.update(func(t *consumer.TenantStats) {
		if t.Tenant == "t005" {
			t.State, t.Parked = policy.Open, 7
		}
	})
	tick(20)
	got := plotsOf(t, srv.URL)
	if len(got) != 3 || got["t005"] == nil || got["t197"] != nil || len(got["t198"]) != 2 {
		t.Fatalf("a tenant in trouble: %v (want t005 in place of t197, the calm one that handled least)", got)
	}
	tick(20)
	if got := plotsOf(t, srv.URL); !slices.Equal(got["t005"], []float64{0}) {
		t.Fatalf("the parked tenant's goodput: %v, want [0]", got["t005"])
	}

	eng.drop("t199")
	tick(20)
	got = plotsOf(t, srv.URL)
	if len(got) != 3 || got["t199"] != nil || got["t197"] == nil {
		t.Fatalf("after t199 was forgotten: %v (want its place to the busiest calm one left)", got)
	}
	for range 10 {
		tick(20)
	}
	if got := plotsOf(t, srv.URL); len(got) != 3 || len(got["t198"]) != 4 || len(got["t005"]) != 4 {
		t.Fatalf("after many samples: %v (want 3 tenants, 4 points each)", got)
	}

	// Another engine: the plots start over.
	c.SetEngine(&stubEngine{}, "other")
	clk.Advance(every)
	c.Sample()
	if got := plotsOf(t, srv.URL); len(got) != 0 {
		t.Fatalf("after SetEngine: %v", got)
	}
}

// The tenant view draws each watched tenant's plots as inline SVG paths,
// with the axis labels, and says since when its breaker is open.
func TestPlotsOnTheTenantView(t *testing.T) {
	clk := newFakeClock()
	eng := &stubEngine{tenants: []consumer.TenantStats{
		{Tenant: "acme", Handled: 100},
		{Tenant: hostile, Handled: 5, State: policy.Open, Parked: 3, OpenSince: clk.Now().Add(-30 * time.Second),
			TimeLag: 45 * time.Second, OldestParked: 44 * time.Second, SpillBacklogAge: 90 * time.Second},
	}}
	c, srv := serve(t, console.Options{Engine: eng, Now: clk.Now, Refresh: time.Second, HistoryEvery: 2 * time.Second, HistoryPoints: 30})
	for range 5 {
		c.Sample()
		eng.update(func(t *consumer.TenantStats) {
			if t.Tenant == "acme" {
				t.Handled += 40
			}
		})
		clk.Advance(2 * time.Second)
	}
	body := do(t, client(t), "GET", srv.URL+"/", nil, nil).body
	if strings.Contains(body, "<script>alert") {
		t.Fatal("a tenant key reached the page as markup")
	}
	cards := regexp.MustCompile(`(?s)<article class="card[^"]*" data-token="([^"]+)">(.*?)</article>`).FindAllStringSubmatch(body, -1)
	if len(cards) != 2 || cards[1][1] != "acme" {
		t.Fatalf("%d cards (want 2, the open tenant first):\n%s", len(cards), body)
	}
	paths := regexp.MustCompile(`<path class="line" d="([^"]*)">`)
	for _, card := range cards {
		ps := paths.FindAllStringSubmatch(card[2], -1)
		if len(ps) != 2 || !strings.HasPrefix(ps[0][1], "M") || !strings.HasPrefix(ps[1][1], "M") {
			t.Fatalf("card %s: paths %v", card[1], ps)
		}
	}
	acme := cards[1][2]
	// acme: 20/s for 4 samples: the goodput axis goes to 20, and its
	// line is flat at the top.
	if !strings.Contains(acme, `goodput <b>20/s</b>`) || !strings.Contains(acme, `<text class="ylab" x="36" y="9">20/s</text>`) ||
		!strings.Contains(acme, "−60s") || !strings.Contains(acme, ">now<") {
		t.Fatalf("acme's card lacks its labels:\n%s", acme)
	}
	// The open tenant: open 30s before the first sample, 10s of samples
	// since.
	open := cards[0][2]
	for _, want := range []string{
		"breaker open for <b>40s</b> (since 11:59:30 UTC)", "oldest message <b>45s</b>", "oldest parked <b>44s</b>",
		"spill backlog <b>1m30s</b>", `time lag <b>45s</b>`, `<text class="ylab" x="36" y="9">50s</text>`,
	} {
		if !strings.Contains(open, want) {
			t.Fatalf("the open tenant's card lacks %q:\n%s", want, open)
		}
	}
	if !strings.Contains(acme, "breaker closed") || !strings.Contains(acme, "nothing waiting") || strings.Contains(acme, "oldest") {
		t.Fatalf("acme's since-when text:\n%s", acme)
	}
	ts := lines(t, do(t, client(t), "GET", srv.URL+"/?format=json", nil, nil).body)[0]["tenants"].([]any)
	row := ts[0].(map[string]any)
	if row["tenant"].(map[string]any)["key"] == "acme" {
		row = ts[1].(map[string]any)
	}
	if row["open_since"] != "2026-10-01T11:59:30Z" || row["open_for_ns"] != float64(40*time.Second) || row["time_lag_ns"] != float64(45*time.Second) ||
		row["oldest_parked_ns"] != float64(44*time.Second) || row["spill_backlog_age_ns"] != float64(90*time.Second) {
		t.Fatalf("JSON since-when fields: %v", row)
	}
}

// The console samples an attached engine by itself, every HistoryEvery.
func TestSamplerRunsWhileAnEngineIsAttached(t *testing.T) {
	eng := &stubEngine{tenants: []consumer.TenantStats{{Tenant: "acme"}}}
	c, srv := serve(t, console.Options{Refresh: time.Millisecond, HistoryEvery: time.Millisecond})
	c.SetEngine(eng, "stub")
	waitFor(t, 20*time.Second, "acme sampled twice", func() bool {
		eng.update(func(t *consumer.TenantStats) { t.Handled++ })
		return len(plotsOf(t, srv.URL)["acme"]) >= 2
	})
}

package console_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// step is one event of a collapsing case, after a pause on the clock.
type step struct {
	after  time.Duration
	kind   consumer.EventKind
	tenant string
	part   int32
	reason dlq.Reason
}

func parked(t string) step  { return step{after: time.Second, kind: consumer.EventParked, tenant: t} }
func resumed(t string) step { return step{after: time.Second, kind: consumer.EventResumed, tenant: t} }

// probes is n parked/resumed pairs of tenant, one event a second.
func probes(tenant string, n int) []step {
	var out []step
	for range n {
		out = append(out, parked(tenant), resumed(tenant))
	}
	return out
}

// Repeated events of one tenant collapse into one line with a count and a
// time span; the rule for what breaks a run is in events.go.
func TestEventRuns(t *testing.T) {
	cat := func(parts ...[]step) []step {
		var out []step
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	// want is each line, oldest first: "tenant kinds xcount".
	for _, tc := range []struct {
		name  string
		steps []step
		want  []string
	}{
		{"alternating pairs of one tenant collapse", probes("acme", 18), []string{"acme parked/resumed x36"}},
		{"a single event stays a line of one", probes("acme", 1)[:1], []string{"acme parked x1"}},
		{"different tenants do not collapse together",
			cat(probes("acme", 3), probes("globex", 2)),
			[]string{"acme parked/resumed x6", "globex parked/resumed x4"}},
		{"tenants interleaved: each its own run, another tenant's event does not break it",
			cat(probes("acme", 1), probes("globex", 1), probes("acme", 1), probes("globex", 1), probes("acme", 1)),
			[]string{"globex parked/resumed x4", "acme parked/resumed x6"}},
		{"the same tenant's dead letter breaks its run",
			cat(probes("acme", 2), []step{{after: time.Second, kind: consumer.EventDeadLettered, tenant: "acme", reason: dlq.ReasonPoison}}, probes("acme", 2)),
			[]string{"acme parked/resumed x4", "acme dead-lettered x1", "acme parked/resumed x4"}},
		{"dead letters of one reason collapse, another reason starts a line",
			[]step{
				{after: time.Second, kind: consumer.EventDeadLettered, tenant: "acme", reason: dlq.ReasonExhausted},
				{after: time.Second, kind: consumer.EventDeadLettered, tenant: "acme", reason: dlq.ReasonExhausted},
				{after: time.Second, kind: consumer.EventDeadLettered, tenant: "acme", reason: dlq.ReasonPermanent},
			},
			[]string{"acme dead-lettered x2", "acme dead-lettered x1"}},
		{"messages handled ahead of a suspect head collapse, per reason",
			[]step{
				{after: time.Second, kind: consumer.EventReordered, tenant: "acme", reason: dlq.ReasonExhausted},
				{after: 0, kind: consumer.EventReordered, tenant: "acme", reason: dlq.ReasonExhausted},
				{after: 0, kind: consumer.EventReordered, tenant: "acme", reason: dlq.ReasonExhausted},
				{after: 0, kind: consumer.EventReordered, tenant: "acme", reason: dlq.ReasonPoison},
			},
			[]string{"acme reordered x3", "acme reordered x1"}},
		{"a pause longer than collapseGap starts a new run",
			cat(probes("acme", 2), []step{{after: 2 * time.Minute, kind: consumer.EventParked, tenant: "acme"}}),
			[]string{"acme parked/resumed x4", "acme parked x1"}},
		{"partition events collapse per partition",
			[]step{
				{after: time.Second, kind: consumer.EventPaused, part: 1},
				{after: time.Second, kind: consumer.EventResumedPartition, part: 1},
				{after: time.Second, kind: consumer.EventPaused, part: 2},
				{after: time.Second, kind: consumer.EventPaused, part: 1},
			},
			[]string{"p2 partition-paused x1", "p1 partition-paused/partition-resumed x3"}},
		{"assignments never collapse",
			[]step{{after: time.Second, kind: consumer.EventAssigned, part: 1}, {after: time.Second, kind: consumer.EventAssigned, part: 1}},
			[]string{"p1 partition-assigned x1", "p1 partition-assigned x1"}},
		{"a run further back than collapseWindow lines is not joined",
			cat(probes("acme", 1)[:1], func() []step {
				var s []step
				for i := range 16 {
					s = append(s, parked(fmt.Sprint("t", i)))
				}
				return s
			}(), probes("acme", 1)[:1]),
			append(append([]string{"acme parked x1"}, func() []string {
				var s []string
				for i := range 16 {
					s = append(s, fmt.Sprintf("t%d parked x1", i))
				}
				return s
			}()...), "acme parked x1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			c, srv := serve(t, console.Options{Now: clk.Now})
			var first, last time.Time
			for i, s := range tc.steps {
				clk.Advance(s.after)
				if i == 0 {
					first = clk.Now()
				}
				last = clk.Now()
				c.OnEvent(consumer.Event{Kind: s.kind, Tenant: s.tenant, Partition: consumer.Partition{Topic: "orders", ID: s.part}, Reason: s.reason})
			}
			ls := lines(t, do(t, client(t), "GET", srv.URL+"/log?format=json", nil, nil).body)
			var got []string
			for _, l := range ls {
				who := fmt.Sprintf("p%v", l["partition"])
				if tn, ok := l["tenant"].(map[string]any); ok {
					who = tn["key"].(string)
				}
				var kinds []string
				for _, k := range l["kinds"].([]any) {
					kinds = append(kinds, k.(string))
				}
				got = append(got, fmt.Sprintf("%s %s x%v", who, strings.Join(kinds, "/"), l["count"]))
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			// The newest line ends with the last event, some line starts
			// with the first, and each line's span is in order.
			earliest := ls[0]["first"].(string)
			for _, l := range ls {
				earliest = min(earliest, l["first"].(string))
				if l["first"].(string) > l["last"].(string) || l["time"] != l["last"] {
					t.Fatalf("line %v: first after last, or time is not last", l)
				}
			}
			if ls[len(ls)-1]["last"] != last.Format(time.RFC3339) || earliest != first.Format(time.RFC3339) {
				t.Fatalf("span %v .. %v, want %v .. %v", earliest, ls[len(ls)-1]["last"], first, last)
			}
		})
	}
}

// A run is one line with its count and span on the page too, and the live
// stream sends it again as it grows, under the same run.
func TestEventRunPageAndStream(t *testing.T) {
	clk := newFakeClock()
	c, srv := serve(t, console.Options{Now: clk.Now})
	c.OnEvent(consumer.Event{Kind: consumer.EventAssigned, Partition: consumer.Partition{Topic: "orders"}})
	start := clk.Now().Add(time.Second)
	for _, s := range probes("acme", 18) {
		clk.Advance(s.after)
		c.OnEvent(consumer.Event{Kind: s.kind, Tenant: s.tenant, Err: errors.New("payment service: 503")})
	}
	page := do(t, client(t), "GET", srv.URL+"/log", nil, nil).body
	want := fmt.Sprintf("×36, %s–%s", start.Format("15:04:05"), clk.Now().Format("15:04:05"))
	if strings.Count(page, "<li data-run") != 2 || !strings.Contains(page, want) || !strings.Contains(page, ">parked/resumed<") {
		t.Fatalf("log page lacks one run line %q:\n%s", want, page)
	}
	ls := lines(t, do(t, client(t), "GET", srv.URL+"/log?format=json", nil, nil).body)
	run, seq := ls[1]["run"], ls[1]["seq"]
	if run != 2.0 || seq != 37.0 || ls[1]["kind"] != "resumed" || ls[1]["error"] != "payment service: 503" {
		t.Fatalf("run line %v", ls[1])
	}
	c.OnEvent(consumer.Event{Kind: consumer.EventParked, Tenant: "acme"})
	ls = lines(t, do(t, client(t), "GET", srv.URL+"/log?format=json", nil, nil).body)
	if len(ls) != 2 || ls[1]["run"] != run || ls[1]["seq"] != 38.0 || ls[1]["count"] != 37.0 {
		t.Fatalf("after one more: %v", ls)
	}
}

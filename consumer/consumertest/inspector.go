package consumertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ringfence/ringfence/dlq"
)

// InspectorHarness gives RunInspector a dead-letter queue to test.
type InspectorHarness interface {
	// Open returns the writing and the inspecting side of a DLQ: on the
	// first call over fresh names, on later calls new instances over the
	// same DLQ (what another process opens).
	Open(t testing.TB) (dlq.Sink, dlq.Inspector)
	// Record returns a dead letter of tenant holding value, as the engine
	// writes it from a message of the harness's source: each call a
	// different message (its own offset or sequence), which Replay can
	// republish to the source.
	Record(tenant, value string) *dlq.Record
	// Replayed returns every message on the harness's source, in order:
	// those Replay republished (the harness writes none itself).
	Replayed(t testing.TB) []Replayed
	// OpenLive writes messages of live data where the DLQ of tenant
	// "acme" would be (a topic or stream named like it) and opens an
	// inspector on that. It returns the inspector (nil when opening
	// refused it, with the error), and a check that fails t if the live
	// data was changed.
	OpenLive(t testing.TB) (in dlq.Inspector, intact func(testing.TB), err error)
}

// Replayed is a message on a DLQ's source. Key is nil on a broker whose
// messages have none (NATS).
type Replayed struct {
	Key, Value []byte
	Headers    []dlq.Header
}

// RunInspector is the conformance suite of a DLQ: a dlq.Sink and a
// dlq.Inspector over the same dead-letter queue. The cases: listing,
// peeking, replaying (a move: the message back on its source with its
// redrive count raised, then gone from the DLQ) and purging per tenant,
// with what they report; a later instance sees what an earlier one wrote;
// records come back byte for byte; crafted tenant keys (wildcards,
// separators, another key's token, over-long keys, the empty key) each
// reach their own dead letters only; copies of one dead letter are
// counted, shown and replayed once; and live data named like a DLQ is
// refused and left as it was.
func RunInspector(t *testing.T, newHarness func(t testing.TB) InspectorHarness) {
	t.Run("ListPeekReplayPurge", func(t *testing.T) { inspectRoundTrip(t, newHarness(t)) })
	t.Run("LaterInstancesSeeEverything", func(t *testing.T) { inspectInstances(t, newHarness(t)) })
	t.Run("ByteForByte", func(t *testing.T) { inspectBytes(t, newHarness(t)) })
	t.Run("CraftedTenantKeysStayApart", func(t *testing.T) { inspectHostile(t, newHarness(t)) })
	t.Run("CopiesCountOnce", func(t *testing.T) { inspectCopies(t, newHarness(t)) })
	t.Run("RefusesLiveData", func(t *testing.T) { inspectLive(t, newHarness(t)) })
}

func inspectCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	t.Cleanup(cancel)
	return ctx
}

func write(t testing.TB, s dlq.Sink, recs ...*dlq.Record) {
	t.Helper()
	for _, r := range recs {
		if err := s.Write(inspectCtx(t), r); err != nil {
			t.Fatalf("write %q of %q: %v", r.Value, r.Tenant, err)
		}
	}
}

func peek(t testing.TB, in dlq.Inspector, tenant string, n int) []dlq.Record {
	t.Helper()
	recs, err := in.Peek(inspectCtx(t), tenant, n)
	if err != nil {
		t.Fatalf("peek %q: %v", tenant, err)
	}
	return recs
}

func values(recs []dlq.Record) []string {
	out := []string{}
	for _, r := range recs {
		out = append(out, string(r.Value))
	}
	return out
}

func summaries(t testing.TB, in dlq.Inspector) map[string]dlq.TenantSummary {
	t.Helper()
	sums, err := in.Tenants(inspectCtx(t))
	if err != nil {
		t.Fatalf("tenants: %v", err)
	}
	out := map[string]dlq.TenantSummary{}
	for i, s := range sums {
		if i > 0 && sums[i-1].Tenant >= s.Tenant {
			t.Fatalf("tenants not sorted by key: %q before %q", sums[i-1].Tenant, s.Tenant)
		}
		if s.Token != dlq.TenantToken(s.Tenant) {
			t.Errorf("tenant %q listed with token %q, want %q", s.Tenant, s.Token, dlq.TenantToken(s.Tenant))
		}
		out[s.Tenant] = s
	}
	return out
}

func purge(t testing.TB, in dlq.Inspector, tenant string, want int) {
	t.Helper()
	if n, err := in.Purge(inspectCtx(t), tenant); err != nil || n != want {
		t.Fatalf("purge %q = %d, %v; want %d", tenant, n, err, want)
	}
}

// failing is h.Record with a reason, error text and the original headers
// the engine keeps (a stale ringfence- header among them, which the DLQ
// must replace, not keep).
func failing(h InspectorHarness, tenant, value string, reason dlq.Reason, errText string) *dlq.Record {
	r := h.Record(tenant, value)
	r.Key = []byte("key-" + value)
	r.Headers = []dlq.Header{{Key: "trace", Value: []byte("t-" + value)}, {Key: dlq.HeaderAttempts, Value: []byte("99")}}
	r.Group, r.Attempts = "billing", 3
	r.FirstFailure = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
	r.LastFailure = r.FirstFailure.Add(time.Second)
	r.Error, r.ErrorType, r.Reason = errText, "*errors.errorString", reason
	r.TraceParent = traceParentOf(value)
	return r
}

// traceParentOf is a W3C traceparent made from value (a process span's,
// which a replayed message's span links to).
func traceParentOf(value string) string {
	id := fmt.Sprintf("%016x", len(value)*1000+int(value[len(value)-1]))
	return "00-" + id + id + "-" + id + "-01"
}

func inspectRoundTrip(t *testing.T, h InspectorHarness) {
	sink, in := h.Open(t)
	ctx := inspectCtx(t)
	a2 := failing(h, "acme", "a2", dlq.ReasonPermanent, "bad json")
	a2.Redrive = 1
	write(t, sink,
		failing(h, "acme", "a1", dlq.ReasonPermanent, "bad json"), a2,
		failing(h, "acme", "a3", dlq.ReasonExhausted, "timeout"))
	for i, reason := range []dlq.Reason{dlq.ReasonPoison, dlq.ReasonPoison, dlq.ReasonPermanent} {
		write(t, sink, failing(h, "initech", "i"+string(rune('1'+i)), reason, "e"))
	}
	for i := range 4 {
		write(t, sink, failing(h, "globex", "g"+string(rune('1'+i)), dlq.ReasonExhausted, "e"))
	}

	sums := summaries(t, in)
	if len(sums) != 3 || sums["acme"].Count != 3 || sums["globex"].Count != 4 || sums["initech"].Count != 3 {
		t.Fatalf("tenants = %+v; want acme 3, globex 4, initech 3", sums)
	}
	if a := sums["acme"]; a.Reason != dlq.ReasonPermanent || a.LastError != "timeout" || a.Records != 3 || a.Oldest.IsZero() || a.Newest.Before(a.Oldest) {
		t.Errorf("acme summary = %+v; want reason permanent (the most common), last error timeout (the newest's)", a)
	}
	if r := sums["initech"].Reason; r != dlq.ReasonPoison {
		t.Errorf("initech reason %q, want poison (the most common, not the newest's)", r)
	}

	got := peek(t, in, "acme", 2)
	if !slices.Equal(values(got), []string{"a1", "a2"}) {
		t.Fatalf("peek acme 2 = %q, want the two oldest, a1 a2", values(got))
	}
	p, want := got[0], failing(h, "acme", "a1", dlq.ReasonPermanent, "bad json")
	switch {
	case p.Tenant != "acme" || string(p.Key) != "key-a1" || p.Source != want.Source || p.Group != "billing" || p.Attempts != 3:
		t.Fatalf("peeked record = %+v", p)
	case p.Error != "bad json" || p.ErrorType != want.ErrorType || p.Reason != dlq.ReasonPermanent || !p.LastFailure.Equal(want.LastFailure):
		t.Fatalf("peeked record's failure = %q %q %q %v", p.Error, p.ErrorType, p.Reason, p.LastFailure)
	case p.TraceParent != want.TraceParent:
		t.Fatalf("peeked record's TraceParent = %q, want %q", p.TraceParent, want.TraceParent)
	case len(p.Headers) != 1 || p.Headers[0].Key != "trace" || string(p.Headers[0].Value) != "t-a1":
		t.Fatalf("peeked headers %q: want the original trace header only (a stale ringfence- header is replaced)", p.Headers)
	case p.Time.IsZero() || len(p.Copies) != 1 || p.Copies[0].Position != p.Position:
		t.Fatalf("peeked record has time %v, position %d, copies %+v", p.Time, p.Position, p.Copies)
	}

	dry, err := in.Replay(ctx, "acme", dlq.ReplayOptions{Limit: 2, DryRun: true})
	if err != nil || !slices.Equal(values(dry), []string{"a1", "a2"}) {
		t.Fatalf("dry run = %q, %v", values(dry), err)
	}
	if n := len(peek(t, in, "acme", 0)); n != 3 || len(h.Replayed(t)) != 0 {
		t.Fatalf("a dry run changed something: %d left, %d replayed", n, len(h.Replayed(t)))
	}
	moved, err := in.Replay(ctx, "acme", dlq.ReplayOptions{Limit: 2})
	if err != nil || !slices.Equal(values(moved), []string{"a1", "a2"}) {
		t.Fatalf("replay limit 2 = %q, %v", values(moved), err)
	}
	if left := peek(t, in, "acme", 0); !slices.Equal(values(left), []string{"a3"}) {
		t.Fatalf("after replay acme holds %q, want a3", values(left))
	}
	back := h.Replayed(t)
	if len(back) != 2 {
		t.Fatalf("the source got %d messages back, want 2", len(back))
	}
	for i, m := range back {
		v := []string{"a1", "a2"}[i]
		if string(m.Value) != v || m.Key != nil && string(m.Key) != "key-"+v || header(m.Headers, "trace") != "t-"+v || header(m.Headers, dlq.HeaderAttempts) != "" {
			t.Fatalf("replayed message %d = key %q value %q headers %q; want %s's with its trace header and no ringfence- failure headers", i, m.Key, m.Value, m.Headers, v)
		}
		if tp := header(m.Headers, dlq.HeaderTraceParent); tp != traceParentOf(v) {
			t.Fatalf("replayed %s carries %s %q, want %q (its process span's)", v, dlq.HeaderTraceParent, tp, traceParentOf(v))
		}
		if n := dlq.RedriveCount(m.Headers); n != i+1 {
			t.Fatalf("replayed %s has redrive count %d, want %d", v, n, i+1)
		}
	}

	purge(t, in, "acme", 1)
	purge(t, in, "acme", 0)
	if n := len(peek(t, in, "globex", 0)); n != 4 {
		t.Fatalf("purging acme left globex %d of 4", n)
	}
	purge(t, in, "globex", 4)
	purge(t, in, "nobody", 0)
	if recs := peek(t, in, "nobody", 0); len(recs) != 0 {
		t.Fatalf("a tenant without dead letters peeks %q", values(recs))
	}
	write(t, sink, failing(h, "acme", "a4", dlq.ReasonPermanent, "later"))
	if got := peek(t, in, "acme", 0); !slices.Equal(values(got), []string{"a4"}) {
		t.Fatalf("after the purge and a new dead letter acme holds %q, want a4", values(got))
	}
	if sums := summaries(t, in); len(sums) != 2 || sums["acme"].Count != 1 || sums["initech"].Count != 3 {
		t.Fatalf("tenants after the purges = %+v; want acme 1, initech 3", sums)
	}
}

func header(hs []dlq.Header, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// An inspector opened before a tenant's first dead letter, written by
// another instance, sees it; so does one opened afterwards.
func inspectInstances(t *testing.T, h InspectorHarness) {
	_, early := h.Open(t)
	if recs := peek(t, early, "acme", 0); len(recs) != 0 {
		t.Fatalf("an empty DLQ peeks %q", values(recs))
	}
	sink, _ := h.Open(t)
	write(t, sink, h.Record("acme", "x1"))
	if got := peek(t, early, "acme", 0); !slices.Equal(values(got), []string{"x1"}) {
		t.Fatalf("after another instance wrote acme's first dead letter, peek = %q", values(got))
	}
	write(t, sink, h.Record("globex", "y1"))
	for _, in := range []dlq.Inspector{early, reopen(t, h)} {
		if sums := summaries(t, in); len(sums) != 2 || sums["acme"].Count != 1 || sums["globex"].Count != 1 {
			t.Fatalf("tenants = %+v; want acme and globex, one each", sums)
		}
	}
}

func reopen(t testing.TB, h InspectorHarness) dlq.Inspector {
	_, in := h.Open(t)
	return in
}

// Keys, values and headers come back byte for byte: an empty key is not
// a null one, repeated header keys are all kept, and bytes a header line
// cannot carry survive.
func inspectBytes(t *testing.T, h InspectorHarness) {
	sink, in := h.Open(t)
	r := h.Record("acme", "")
	r.Key, r.Value = []byte{}, []byte{0x00, 0xff, '\r', '\n', ' '}
	r.Headers = []dlq.Header{
		{Key: "h", Value: []byte("1")}, {Key: "h", Value: []byte("2")},
		{Key: "lines", Value: []byte("a\r\nb")}, {Key: "padded", Value: []byte("  x  ")},
	}
	write(t, sink, r)
	got := peek(t, in, "acme", 0)
	if len(got) != 1 {
		t.Fatalf("peek = %d records, want 1", len(got))
	}
	g := got[0]
	if g.Key == nil || len(g.Key) != 0 || !bytes.Equal(g.Value, r.Value) || len(g.Headers) != len(r.Headers) {
		t.Fatalf("record came back as key %v (nil %v) value %q headers %q", g.Key, g.Key == nil, g.Value, g.Headers)
	}
	for i, x := range r.Headers {
		if g.Headers[i].Key != x.Key || !bytes.Equal(g.Headers[i].Value, x.Value) {
			t.Fatalf("header %d came back as %q=%q, want %q=%q", i, g.Headers[i].Key, g.Headers[i].Value, x.Key, x.Value)
		}
	}
}

// Tenant keys crafted to look like wildcards, separators, paths, another
// key's token, an over-long key and the empty key each reach their own
// dead letters and no one else's.
func inspectHostile(t *testing.T, h InspectorHarness) {
	sink, in := h.Open(t)
	long := strings.Repeat("x.", 200) // hashed
	tenants := []string{"acme", "acme.*", "acme.>", "*", ">", "a b", " ", "evil.>.x", "../x", "a/b", dlq.TenantToken("acme.*"), long}
	for _, tn := range tenants {
		write(t, sink, h.Record(tn, "v:"+tn))
	}
	orphan := h.Record("", "orphan")
	orphan.Reason = dlq.ReasonNoTenant
	write(t, sink, orphan)

	for _, tn := range tenants {
		if got := peek(t, in, tn, 0); len(got) != 1 || got[0].Tenant != tn || string(got[0].Value) != "v:"+tn {
			t.Fatalf("tenant %q peeks %q, want only its own", tn, values(got))
		}
	}
	if got := peek(t, in, "", 0); len(got) != 1 || string(got[0].Value) != "orphan" || got[0].Reason != dlq.ReasonNoTenant {
		t.Fatalf("the no-tenant bucket peeks %q", values(got))
	}
	if got := peek(t, in, "acme.>.*", 0); len(got) != 0 {
		t.Fatalf("a wildcard-looking key without dead letters peeks %q", values(got))
	}
	sums := summaries(t, in)
	want := append([]string{""}, tenants...)
	var listed []string
	for tn, s := range sums {
		listed = append(listed, tn)
		if s.Count != 1 {
			t.Errorf("tenant %q counts %d, want 1", tn, s.Count)
		}
	}
	slices.Sort(listed)
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		t.Fatalf("tenants = %q, want %q", listed, want)
	}
	purge(t, in, "acme.*", 1)
	purge(t, in, dlq.TenantToken("acme.*"), 1)
	if got := peek(t, in, "acme", 0); len(got) != 1 {
		t.Fatalf("purging keys like acme's took acme's dead letter: %q left", values(got))
	}
}

// One message dead-lettered several times (redeliveries) is one dead
// letter: counted once, peeked once with its copies listed, replayed once;
// a copy written after the replay is not shown again.
func inspectCopies(t *testing.T, h InspectorHarness) {
	sink, in := h.Open(t)
	poison := h.Record("acme", "poison")
	poison.Reason = dlq.ReasonPoison
	copyOf := func(attempts int) *dlq.Record {
		c := *poison
		c.Attempts = attempts
		return &c
	}
	write(t, sink, copyOf(1), copyOf(2), h.Record("acme", "other"), copyOf(3))
	sum := summaries(t, in)["acme"]
	if sum.Count != 2 {
		t.Fatalf("acme summary %+v; want 2 dead letters", sum)
	}
	got := peek(t, in, "acme", 0)
	if !slices.Equal(values(got), []string{"poison", "other"}) {
		t.Fatalf("peek = %q, want poison once, then other", values(got))
	}
	stored := 0
	for _, r := range got {
		if len(r.Copies) == 0 || r.Copies[0].Position != r.Position {
			t.Fatalf("%s lists copies %+v, want them from its own position %d", r.Value, r.Copies, r.Position)
		}
		stored += len(r.Copies)
	}
	if stored != sum.Records {
		t.Fatalf("the dead letters list %d stored copies, the summary counts %d records", stored, sum.Records)
	}
	moved, err := in.Replay(inspectCtx(t), "acme", dlq.ReplayOptions{Limit: 1})
	if err != nil || !slices.Equal(values(moved), []string{"poison"}) {
		t.Fatalf("replay limit 1 = %q, %v", values(moved), err)
	}
	n := 0
	for _, m := range h.Replayed(t) {
		if string(m.Value) == "poison" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the source got %d copies of the poison message back, want 1", n)
	}
	write(t, sink, copyOf(4))
	if got := peek(t, in, "acme", 0); !slices.Equal(values(got), []string{"other"}) {
		t.Fatalf("after replaying poison and a late copy of it, peek = %q, want other", values(got))
	}
}

// Live data where a DLQ would be is refused, with an error wrapping
// dlq.ErrNotDLQ, by opening or by every inspection, and nothing of it
// changes.
func inspectLive(t *testing.T, h InspectorHarness) {
	in, intact, err := h.OpenLive(t)
	if err == nil {
		ctx := inspectCtx(t)
		_, err1 := in.Tenants(ctx)
		_, err2 := in.Peek(ctx, "acme", 0)
		_, err3 := in.Replay(ctx, "acme", dlq.ReplayOptions{})
		n, err4 := in.Purge(ctx, "acme")
		for i, e := range []error{err1, err2, err3, err4} {
			if !errors.Is(e, dlq.ErrNotDLQ) {
				t.Errorf("inspection %d of live data: %v, want an error wrapping ErrNotDLQ", i+1, e)
			}
		}
		if n != 0 {
			t.Errorf("purge of live data reports %d", n)
		}
	} else if !errors.Is(err, dlq.ErrNotDLQ) {
		t.Fatalf("opening live data as a DLQ: %v, want an error wrapping ErrNotDLQ", err)
	}
	intact(t)
}

package consumer_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/tracetree"
	"github.com/ringfence/ringfence/policy"
)

// traced returns a tracer provider recording into the returned recorder.
func traced(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, sr
}

// producerHeaders starts and ends a producer span and returns the headers
// a producer would send with its message: tenant's, and its traceparent.
func producerHeaders(tp trace.TracerProvider, tenant string) []dlq.Header {
	_, span := tp.Tracer("producer").Start(context.Background(), "send orders", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	mc := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpan(context.Background(), span), mc)
	return []dlq.Header{
		{Key: consumertest.TenantHeader, Value: []byte(tenant)},
		{Key: "traceparent", Value: []byte(mc.Get("traceparent"))},
	}
}

// processSpans returns the ended process spans of the message valued v,
// oldest first.
func processSpans(sr *tracetest.SpanRecorder, offset int64) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == "messaging.kafka.offset" && a.Value.AsInt64() == offset {
				out = append(out, s)
			}
		}
	}
	return out
}

func eventNames(s sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, e := range s.Events() {
		out = append(out, e.Name)
	}
	return out
}

// linkOf returns the link of s whose ringfence.link attribute is kind.
func linkOf(s sdktrace.ReadOnlySpan, kind string) (sdktrace.Link, bool) {
	for _, l := range s.Links() {
		for _, a := range l.Attributes {
			if a.Key == "ringfence.link" && a.Value.AsString() == kind {
				return l, true
			}
		}
	}
	return sdktrace.Link{}, false
}

// TestTraceParkSpillRefeed follows one message that fails until its
// tenant's breaker opens, parks, spills, is re-fed and handled: its first
// process span ends with "spilled", the re-fed copy's span is linked to it
// and to the producer's span, and the events come in that order.
func TestTraceParkSpillRefeed(t *testing.T) {
	tp, sr := traced(t)
	h := consumertest.NewMemHarness(1)
	var down atomic.Bool
	down.Store(true)
	hd := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if !trace.SpanFromContext(ctx).SpanContext().IsValid() {
			return policy.Permanent(errors.New("handler ctx carries no span"))
		}
		if down.Load() {
			return errors.New("dependency down")
		}
		return nil
	})
	cfg := consumer.Config{Spill: h.Sp, MaxParkedPerTenant: 2, Tracing: consumer.Tracing{Provider: tp}}
	e := startScripted(t, h, fastPolicy(), cfg, hd)
	hdrs := producerHeaders(tp, "bad")
	for i := range 4 {
		h.B.Append(0, nil, []byte{'a' + byte(i)}, hdrs...)
	}
	if !within(consumertest.WaitTimeout, func() bool { return len(processSpans(sr, 0)) >= 1 }) {
		t.Fatal("the first message's process span never ended (spilled)")
	}
	down.Store(false)
	if !within(consumertest.WaitTimeout, func() bool { return e.c.Totals().Handled >= 4 }) {
		t.Fatalf("handled %d of 4", e.c.Totals().Handled)
	}
	spans := processSpans(sr, 0)
	if len(spans) != 2 {
		t.Fatalf("offset 0 has %d process spans, want 2 (spilled, then re-fed): %v", len(spans), spans)
	}
	orig, refed := spans[0], spans[1]
	t.Logf("trace of offset 0:\n%s", tracetree.Format(sr.Ended()))

	oe := eventNames(orig)
	if oe[0] != "attempt" || oe[len(oe)-1] != "spilled" {
		t.Errorf("original span's events %v: want attempts first, spilled last", oe)
	}
	if p, s := slices.Index(oe, "park"), slices.Index(oe, "spilled"); p < 0 || p > s {
		t.Errorf("original span's events %v: want park before spilled", oe)
	}
	if orig.Name() != "process orders" || orig.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("span %q kind %v, want \"process orders\" consumer", orig.Name(), orig.SpanKind())
	}
	re := eventNames(refed)
	if re[0] != "re-fed" || re[len(re)-1] != "attempt" {
		t.Errorf("re-fed span's events %v: want re-fed first, the successful attempt last", re)
	}
	l, ok := linkOf(refed, "spilled")
	if !ok || l.SpanContext.SpanID() != orig.SpanContext().SpanID() {
		t.Errorf("re-fed span's links %v: want one to the original process span %v", refed.Links(), orig.SpanContext().SpanID())
	}
	for _, s := range spans {
		if _, ok := linkOf(s, "producer"); !ok {
			t.Errorf("span %v has no link to the producer's span", s.SpanContext().SpanID())
		}
		if s.Parent().IsValid() {
			t.Errorf("span %v has a parent; the producer's context is a link by default", s.SpanContext().SpanID())
		}
		want := map[string]string{"messaging.destination.name": "orders", "messaging.consumer.group.name": h.Group, "ringfence.tenant": "bad", "messaging.destination.partition.id": "0"}
		for _, a := range s.Attributes() {
			if w, ok := want[string(a.Key)]; ok && a.Value.String() == w {
				delete(want, string(a.Key))
			}
		}
		if len(want) > 0 {
			t.Errorf("span %v lacks attributes %v", s.SpanContext().SpanID(), want)
		}
	}
}

// TestTraceDeadLetterReplay dead-letters a message, delivers its record
// again as a replay would (ReplayHeaders), and finds the replayed
// message's process span linked to the dead-lettered one's, and to the
// producer's, with the producer's traceparent kept in the record.
func TestTraceDeadLetterReplay(t *testing.T) {
	tp, sr := traced(t)
	h := consumertest.NewMemHarness(1)
	hd := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if _, replayed := m.Header(dlq.HeaderRedrive); !replayed {
			return policy.Permanent(errors.New("bad payload"))
		}
		return nil
	})
	cfg := consumer.Config{Tracing: consumer.Tracing{Provider: tp}}
	e := startScripted(t, h, fastPolicy(), cfg, hd)
	h.B.Append(0, nil, []byte("x"), producerHeaders(tp, "t1")...)
	var recs []dlq.Record
	if !within(consumertest.WaitTimeout, func() bool { recs = h.S.Records("t1", false); return len(recs) == 1 }) {
		t.Fatal("no dead letter")
	}
	rec := recs[0]
	if rec.TraceParent == "" {
		t.Fatal("the dead letter carries no traceparent")
	}
	if _, ok := (&consumer.Message{Headers: rec.Headers}).Header("traceparent"); !ok {
		t.Error("the dead letter lost the producer's traceparent")
	}
	h.B.Append(0, rec.Key, rec.Value, rec.ReplayHeaders()...)
	if !within(consumertest.WaitTimeout, func() bool { return e.c.Totals().Handled == 1 }) {
		t.Fatal("the replayed message was not handled")
	}
	orig := processSpans(sr, 0)
	replayed := processSpans(sr, 1)
	if len(orig) != 1 || len(replayed) != 1 {
		t.Fatalf("process spans: %d of the original, %d of the replay; want 1 each", len(orig), len(replayed))
	}
	t.Logf("trace:\n%s", tracetree.Format(sr.Ended()))
	if ev := eventNames(orig[0]); ev[len(ev)-1] != "dead-letter" {
		t.Errorf("original span's events %v: want dead-letter last", ev)
	}
	l, ok := linkOf(replayed[0], "dead-lettered")
	if !ok || l.SpanContext.SpanID() != orig[0].SpanContext().SpanID() {
		t.Errorf("replayed span's links %v: want one to the dead-lettered span %v", replayed[0].Links(), orig[0].SpanContext().SpanID())
	}
	if _, ok := linkOf(replayed[0], "producer"); !ok {
		t.Error("replayed span has no link to the producer's span")
	}
}

// TestTraceParentFromProducer makes the producer's span the parent.
func TestTraceParentFromProducer(t *testing.T) {
	tp, sr := traced(t)
	h := consumertest.NewMemHarness(1)
	hd := consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil })
	cfg := consumer.Config{Tracing: consumer.Tracing{Provider: tp, ParentFromProducer: true, System: "kafka"}}
	e := startScripted(t, h, fastPolicy(), cfg, hd)
	hdrs := producerHeaders(tp, "t1")
	h.B.Append(0, nil, []byte("x"), hdrs...)
	if !within(consumertest.WaitTimeout, func() bool { return len(processSpans(sr, 0)) == 1 }) {
		t.Fatalf("no process span (handled %d)", e.c.Totals().Handled)
	}
	s := processSpans(sr, 0)[0]
	var producer sdktrace.ReadOnlySpan
	for _, x := range sr.Ended() {
		if x.SpanKind() == trace.SpanKindProducer {
			producer = x
		}
	}
	if s.Parent().SpanID() != producer.SpanContext().SpanID() || s.SpanContext().TraceID() != producer.SpanContext().TraceID() {
		t.Errorf("process span's parent %v, want the producer's span %v", s.Parent().SpanID(), producer.SpanContext().SpanID())
	}
	if len(s.Links()) != 0 {
		t.Errorf("links %v, want none", s.Links())
	}
	found := false
	for _, a := range s.Attributes() {
		found = found || (a.Key == "messaging.system" && a.Value.AsString() == "kafka")
	}
	if !found {
		t.Error("no messaging.system=kafka")
	}
}

// endedWith counts the ended process spans whose last event is name.
func endedWith(sr *tracetest.SpanRecorder, name string) int {
	n := 0
	for _, s := range sr.Ended() {
		if ev := eventNames(s); s.SpanKind() == trace.SpanKindConsumer && len(ev) > 0 && ev[len(ev)-1] == name {
			n++
		}
	}
	return n
}

// TestTraceEndsWhatTheEngineLetsGo: the spans of messages parked behind an
// open breaker end when their partition is revoked ("revoked") and, for
// their redelivered copies, when the engine shuts down ("shutdown"), so
// that no span is left open and unexported.
func TestTraceEndsWhatTheEngineLetsGo(t *testing.T) {
	tp, sr := traced(t)
	h := consumertest.NewMemHarness(1)
	hd := consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return errors.New("dependency down") })
	cfg := consumer.Config{Tracing: consumer.Tracing{Provider: tp}}
	e := startScripted(t, h, fastPolicy(), cfg, hd)
	for i := range 5 {
		h.B.Append(0, nil, []byte{'a' + byte(i)}, dlq.Header{Key: consumertest.TenantHeader, Value: []byte("bad")})
	}
	parked := func() bool { ts, _ := e.c.Tenant("bad"); return ts.Parked >= 4 }
	if !within(consumertest.WaitTimeout, parked) {
		t.Fatal("tenant bad never parked its messages")
	}
	e.src.Rebalance()
	if !within(consumertest.WaitTimeout, func() bool { return endedWith(sr, "revoked") >= 4 }) {
		t.Fatalf("%d spans ended as revoked, want at least the 4 parked behind the head", endedWith(sr, "revoked"))
	}
	if !within(consumertest.WaitTimeout, parked) {
		t.Fatal("the redelivered messages never parked")
	}
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.done <- nil // for the cleanup's stop
	if n := endedWith(sr, "shutdown"); n < 4 {
		t.Errorf("%d spans ended at shutdown, want at least the 4 parked behind the head", n)
	}
}

package consumer

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/ringfence/ringfence/dlq"
)

// This file is tracing: a process span per message, from its delivery to
// its settle (see the package doc's # Tracing). Every call here is made
// with no engine lock held: a TracerProvider's span processors are user
// code.

// Tracing configures OpenTelemetry traces. The zero value traces nothing.
type Tracing struct {
	// Provider makes the engine's tracer. Nil means no tracing: the engine
	// then starts no span and allocates nothing for tracing.
	Provider trace.TracerProvider
	// ParentFromProducer makes the producer's span (read from the
	// message's headers by Propagator) the parent of the process span.
	// False (the default, as the messaging conventions advise) starts a
	// trace of its own for each process span, linked to the producer's.
	ParentFromProducer bool
	// Propagator reads the producer's context from a message's headers.
	// Nil means W3C Trace Context (the traceparent header).
	Propagator propagation.TextMapPropagator
	// System is the messaging.system attribute ("kafka", "nats"). Empty
	// means what the Source reports (SystemNamer), if anything.
	System string
}

// SystemNamer may be implemented by a Source to name its messaging system
// in traces (the messaging.system attribute: "kafka", "nats").
type SystemNamer interface {
	MessagingSystem() string
}

// HeaderTraceParent carries the W3C traceparent of a message's process
// span in its spill-log copy and in its dead-letter record (dlq.Record's
// TraceParent): the span started for the re-fed copy, or for the replayed
// dead letter, is linked to it.
const HeaderTraceParent = dlq.HeaderTraceParent

// Attribute keys of ringfence's own, on process spans and their events.
const (
	attrTenant   = attribute.Key("ringfence.tenant")
	attrRefed    = attribute.Key("ringfence.refed")
	attrStream   = attribute.Key("ringfence.nats.stream")
	attrSequence = attribute.Key("ringfence.nats.sequence")
	attrAttempt  = attribute.Key("ringfence.attempt")
	attrError    = attribute.Key("ringfence.error")
	attrReason   = attribute.Key("ringfence.reason")
	attrDelay    = attribute.Key("ringfence.delay")
	attrLink     = attribute.Key("ringfence.link")
)

// maxTenantAttr bounds the ringfence.tenant attribute: the tenant's token
// (dlq.TenantToken: readable for common keys, hashed when long), cut to
// this many bytes.
const maxTenantAttr = 64

// tracer is the engine's tracing state; nil when Tracing.Provider is.
type tracer struct {
	t      trace.Tracer
	prop   propagation.TextMapPropagator
	parent bool
	group  string
	system atomic.Pointer[string]
	// names caches span names by destination, up to maxNames of them.
	names sync.Map
	nn    atomic.Int32
}

const maxNames = 256

func newTracer(cfg Config) *tracer {
	tc := cfg.Tracing
	if tc.Provider == nil || isNilValue(tc.Provider) {
		return nil
	}
	tr := &tracer{
		t:      tc.Provider.Tracer("github.com/ringfence/ringfence/consumer", trace.WithSchemaURL(semconv.SchemaURL)),
		prop:   tc.Propagator,
		parent: tc.ParentFromProducer,
		group:  cfg.Group,
	}
	if tr.prop == nil {
		tr.prop = propagation.TraceContext{}
	}
	if tc.System != "" {
		tr.system.Store(&tc.System)
	}
	return tr
}

// setSource takes the messaging system from src unless Tracing named one.
func (tr *tracer) setSource(src Source) {
	if tr.system.Load() != nil {
		return
	}
	if n, ok := src.(SystemNamer); ok {
		s := n.MessagingSystem()
		tr.system.Store(&s)
	}
}

// name returns m's span name: "process <destination>", the destination
// being the NATS stream (a subject may name a tenant) or the Kafka topic.
func (tr *tracer) name(m *Message) string {
	dest := m.Stream
	if dest == "" {
		dest = m.Topic
	}
	if v, ok := tr.names.Load(dest); ok {
		return v.(string)
	}
	n := "process " + dest
	if tr.nn.Load() < maxNames {
		if _, loaded := tr.names.LoadOrStore(dest, n); !loaded {
			tr.nn.Add(1)
		}
	}
	return n
}

// start starts m's process span, as m reaches the engine (delivered, or
// read back from its spill log: refed). The producer's context, from m's
// headers, is its parent or a link; a HeaderTraceParent (a spilled or
// dead-lettered copy's process span) is a link too. A span the sampler
// drops is not kept: m is then untraced, and its spill copy or dead
// letter carries no HeaderTraceParent.
func (tr *tracer) start(m *Message, tenant string, refed bool) {
	ctx := context.Background()
	var links [2]trace.Link
	ls := links[:0]
	if p := trace.SpanContextFromContext(tr.prop.Extract(ctx, headerCarrier(m.Headers))); p.IsValid() {
		if tr.parent {
			ctx = trace.ContextWithRemoteSpanContext(ctx, p)
		} else {
			ls = append(ls, trace.Link{SpanContext: p, Attributes: []attribute.KeyValue{attrLink.String("producer")}})
		}
	}
	if v, ok := m.Header(HeaderTraceParent); ok {
		orig := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), ownCarrier(v)))
		if orig.IsValid() {
			kind := "dead-lettered"
			if refed {
				kind = "spilled"
			}
			ls = append(ls, trace.Link{SpanContext: orig, Attributes: []attribute.KeyValue{attrLink.String(kind)}})
		}
	}
	_, span := tr.t.Start(ctx, tr.name(m), trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(ls...))
	if !span.IsRecording() {
		// Sampled out: nothing to record, and no context to carry on.
		return
	}
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs, semconv.MessagingOperationTypeProcess, semconv.MessagingOperationNameKey.String("process"),
		semconv.MessagingDestinationNameKey.String(m.Topic))
	if s := tr.system.Load(); s != nil && *s != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(*s))
	}
	if tr.group != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupNameKey.String(tr.group))
	}
	if m.Stream != "" {
		attrs = append(attrs, attrStream.String(m.Stream), attrSequence.Int64(m.Offset))
	} else {
		attrs = append(attrs, semconv.MessagingDestinationPartitionIDKey.String(strconv.Itoa(int(m.Partition.ID))),
			semconv.MessagingKafkaOffsetKey.Int64(m.Offset))
	}
	if tenant != "" {
		tok := dlq.TenantToken(tenant)
		if len(tok) > maxTenantAttr {
			tok = tok[:maxTenantAttr] // the token is ASCII
		}
		attrs = append(attrs, attrTenant.String(tok))
	}
	if refed {
		attrs = append(attrs, attrRefed.Bool(true))
	}
	span.SetAttributes(attrs...)
	if refed {
		span.AddEvent("re-fed")
	}
	m.st.fail, m.st.traced = &failState{span: span}, true
}

// spanOf returns m's process span, or nil.
func spanOf(m *Message) trace.Span {
	if m.st.traced {
		return m.st.fail.span
	}
	return nil
}

// traceAttempt records a failed attempt of m (number n in all).
func traceAttempt(m *Message, n int, err error, panicked bool) {
	s := spanOf(m)
	if s == nil {
		return
	}
	s.AddEvent("attempt", trace.WithAttributes(attrAttempt.Int(n), attrError.String(errText(err)), attribute.Bool("ringfence.panicked", panicked)))
}

// traceEvent adds the event name to m's span, with a delay if d > 0.
func traceEvent(m *Message, name string, d time.Duration) {
	s := spanOf(m)
	if s == nil {
		return
	}
	if d > 0 {
		s.AddEvent(name, trace.WithAttributes(attrDelay.String(d.String())))
		return
	}
	s.AddEvent(name)
}

// tracePark notes that m, its lane's head, waits behind its tenant's
// breaker for d; traceResume that it got a permit again.
func tracePark(m *Message, d time.Duration) {
	if m.st.traced && !m.st.fail.tparked {
		m.st.fail.tparked = true
		traceEvent(m, "park", d)
	}
}

func traceResume(m *Message) {
	if m.st.traced && m.st.fail.tparked {
		m.st.fail.tparked = false
		traceEvent(m, "resume", 0)
	}
}

// traceHandled ends m's span: its handler succeeded at attempt n.
func traceHandled(m *Message) {
	s := m.st.fail.span
	s.AddEvent("attempt", trace.WithAttributes(attrAttempt.Int(m.st.fail.total+1)))
	s.End()
}

// traceDead ends m's span: its dead letter was written.
func traceDead(m *Message, reason dlq.Reason, cause error) {
	s := spanOf(m)
	if s == nil {
		return
	}
	s.AddEvent("dead-letter", trace.WithAttributes(attrReason.String(string(reason)), attrError.String(errText(cause))))
	s.SetStatus(codes.Error, "dead-lettered: "+string(reason))
	s.End()
}

// traceSpilled ends m's span: its spill-log copy was acknowledged.
func traceSpilled(m *Message, reason SpillReason) {
	s := spanOf(m)
	if s == nil {
		return
	}
	s.AddEvent("spilled", trace.WithAttributes(attrReason.String(reason.String())))
	s.End()
}

// openSpans returns sh's traced messages that wait in the engine, unsettled
// (queued, parked, waiting to be spilled, set aside), for their spans to
// be ended as the engine lets go of them (revocation, shutdown). A running
// lane's are left to its worker. Called with sh.mu held.
func (c *Consumer) openSpans(sh *shard) []*Message {
	var out []*Message
	keep := func(m *Message) {
		if m.st.traced {
			out = append(out, m)
		}
	}
	add := func(l *lane) {
		if l == nil || l.state == laneRunning {
			return
		}
		for i := range l.q.len() {
			keep(l.q.at(i))
		}
		for i := range l.pend.len() {
			keep(l.pend.at(i))
		}
	}
	for l := range sh.lanes.all() {
		add(l)
	}
	add(sh.none)
	for _, m := range sh.aside.msgs {
		keep(m)
	}
	return out
}

// traceDropped ends m's span without a settle: a copy re-fed already, or a
// message the engine lets go of unsettled (revoked, shutdown), which its
// redelivery traces anew.
func traceDropped(m *Message, why string) {
	if s := spanOf(m); s != nil {
		s.AddEvent(why)
		s.End()
	}
}

// traceParent returns the W3C traceparent of m's process span, or "".
func traceParent(m *Message) string {
	s := spanOf(m)
	if s == nil {
		return ""
	}
	sc := s.SpanContext()
	if !sc.IsValid() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// withTraceParent returns hs with HeaderTraceParent set to tp: a new
// slice (hs may share its array with the source's buffers), without any
// earlier HeaderTraceParent.
func withTraceParent(hs []Header, tp string) []Header {
	out := make([]Header, 0, len(hs)+1)
	for _, h := range hs {
		if h.Key != HeaderTraceParent {
			out = append(out, h)
		}
	}
	return append(out, Header{Key: HeaderTraceParent, Value: []byte(tp)})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	s, _ := dlq.CapError(err)
	return s
}

// headerCarrier reads a message's headers for a propagator.
type headerCarrier []Header

func (c headerCarrier) Get(key string) string {
	for _, h := range c {
		if strings.EqualFold(h.Key, key) {
			return string(h.Value)
		}
	}
	return ""
}

func (c headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	ks := make([]string, len(c))
	for i, h := range c {
		ks[i] = h.Key
	}
	return ks
}

// ownCarrier presents a HeaderTraceParent value as a traceparent.
type ownCarrier []byte

func (c ownCarrier) Get(key string) string {
	if key == "traceparent" {
		return string(c)
	}
	return ""
}

func (c ownCarrier) Set(string, string) {}
func (c ownCarrier) Keys() []string     { return []string{"traceparent"} }

package demo

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/tracetree"
)

// maxTraceSpans bounds the spans a traceRecorder keeps: the bad tenant's
// first ones, enough for the messages of its fault to park, spill and
// come back.
const maxTraceSpans = 20000

// traceRecorder is an in-memory span processor that keeps the ended
// process spans of one tenant (by its ringfence.tenant token).
type traceRecorder struct {
	token string
	tp    *sdktrace.TracerProvider

	mu    sync.Mutex
	spans []sdktrace.ReadOnlySpan
}

func newTraceRecorder(tenant string) *traceRecorder {
	r := &traceRecorder{token: dlq.TenantToken(tenant)}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r))
	return r
}

func (r *traceRecorder) tracing() consumer.Tracing { return consumer.Tracing{Provider: r.tp} }

func (r *traceRecorder) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (r *traceRecorder) Shutdown(context.Context) error                  { return nil }
func (r *traceRecorder) ForceFlush(context.Context) error                { return nil }

func (r *traceRecorder) OnEnd(s sdktrace.ReadOnlySpan) {
	for _, a := range s.Attributes() {
		if a.Key == "ringfence.tenant" && a.Value.AsString() == r.token {
			r.mu.Lock()
			if len(r.spans) < maxTraceSpans {
				r.spans = append(r.spans, s)
			}
			r.mu.Unlock()
			return
		}
	}
}

// print writes the trees of n messages: those whose first span saw a park
// or a spill first, then any, each with the spans linked to it.
func (r *traceRecorder) print(w io.Writer, broker string, n int) {
	r.mu.Lock()
	spans := slices.Clone(r.spans)
	r.mu.Unlock()
	linked := map[string][]sdktrace.ReadOnlySpan{} // by the span ID linked to
	for _, s := range spans {
		for _, l := range s.Links() {
			linked[l.SpanContext.SpanID().String()] = append(linked[l.SpanContext.SpanID().String()], s)
		}
	}
	eventful := func(s sdktrace.ReadOnlySpan) bool {
		return slices.ContainsFunc(s.Events(), func(e sdktrace.Event) bool { return e.Name == "park" || e.Name == "spilled" })
	}
	var picked []sdktrace.ReadOnlySpan
	for _, want := range []bool{true, false} {
		for _, s := range spans {
			if len(picked) == n {
				break
			}
			refed := slices.ContainsFunc(s.Attributes(), func(a attribute.KeyValue) bool { return a.Key == "ringfence.refed" })
			if !refed && eventful(s) == want && !slices.Contains(picked, s) {
				picked = append(picked, s)
			}
		}
	}
	fmt.Fprintf(w, "\nTraces (%s, bad tenant, %d of %d spans kept):\n", broker, len(picked), len(spans))
	for _, s := range picked {
		tree := []sdktrace.ReadOnlySpan{s}
		for i := 0; i < len(tree); i++ {
			tree = append(tree, linked[tree[i].SpanContext().SpanID().String()]...)
		}
		fmt.Fprintln(w, tracetree.Format(tree))
	}
	_ = r.tp.Shutdown(context.Background())
}

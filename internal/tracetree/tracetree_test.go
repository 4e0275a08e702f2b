package tracetree_test

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ringfence/ringfence/internal/tracetree"
)

// TestFormatNestsChildrenAndLinked puts a child under its parent and a
// root span under the span it links to, marked with the link's kind.
func TestFormatNestsChildrenAndLinked(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	tr := tp.Tracer("t")
	ctx, first := tr.Start(context.Background(), "process a", trace.WithAttributes(attribute.String("ringfence.tenant", "acme")))
	first.AddEvent("spilled")
	_, child := tr.Start(ctx, "handler")
	child.End()
	first.End()
	_, again := tr.Start(context.Background(), "process a", trace.WithLinks(trace.Link{
		SpanContext: first.SpanContext(), Attributes: []attribute.KeyValue{attribute.String("ringfence.link", "spilled")},
	}))
	again.AddEvent("re-fed")
	again.End()

	got := tracetree.Format(sr.Ended())
	want := strings.Join([]string{
		"process a [internal] ringfence.tenant=acme",
		"  · spilled",
		"  handler [internal]",
		"  (linked from spilled)",
		"  process a [internal]",
		"    · re-fed",
		"",
	}, "\n")
	if got != want {
		t.Errorf("Format:\n%s\nwant:\n%s", got, want)
	}
}

// Package tracetree prints finished spans as a tree, for tests and the
// demo: children under their parent, and a span whose parent is not among
// them under the last span it links to that is (a re-fed or replayed
// message's process span under the original's; a process span under its
// producer's "send" span), marked with the link's kind.
package tracetree

import (
	"fmt"
	"sort"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Shown lists the attributes printed on a span's line, in this order.
var Shown = []attribute.Key{
	"messaging.system", "messaging.destination.name", "messaging.destination.partition.id",
	"messaging.kafka.offset", "ringfence.nats.sequence", "ringfence.tenant", "ringfence.refed",
}

// Format returns spans as an indented tree, one span or event a line.
func Format(spans []sdktrace.ReadOnlySpan) string {
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	type edge struct {
		s    sdktrace.ReadOnlySpan
		link string
	}
	kids := map[trace.SpanID][]edge{}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if _, ok := byID[s.Parent().SpanID()]; ok && s.Parent().IsValid() {
			kids[s.Parent().SpanID()] = append(kids[s.Parent().SpanID()], edge{s, ""})
			continue
		}
		var to trace.SpanID
		kind := ""
		for _, l := range s.Links() {
			if _, ok := byID[l.SpanContext.SpanID()]; ok {
				to, kind = l.SpanContext.SpanID(), "link"
				for _, a := range l.Attributes {
					if a.Key == "ringfence.link" {
						kind = "linked from " + a.Value.String()
					}
				}
			}
		}
		if kind != "" {
			kids[to] = append(kids[to], edge{s, kind})
			continue
		}
		roots = append(roots, s)
	}
	byStart := func(a, b sdktrace.ReadOnlySpan) bool { return a.StartTime().Before(b.StartTime()) }
	sort.SliceStable(roots, func(i, j int) bool { return byStart(roots[i], roots[j]) })
	var b strings.Builder
	var walk func(s sdktrace.ReadOnlySpan, depth int, link string)
	walk = func(s sdktrace.ReadOnlySpan, depth int, link string) {
		pad := strings.Repeat("  ", depth)
		if link != "" {
			fmt.Fprintf(&b, "%s(%s)\n", pad, link)
		}
		fmt.Fprintf(&b, "%s%s [%s]%s%s\n", pad, s.Name(), s.SpanKind(), attrs(s.Attributes(), Shown), status(s))
		for _, e := range s.Events() {
			fmt.Fprintf(&b, "%s  · %s%s\n", pad, e.Name, attrs(e.Attributes, nil))
		}
		ks := kids[s.SpanContext().SpanID()]
		sort.SliceStable(ks, func(i, j int) bool { return byStart(ks[i].s, ks[j].s) })
		for _, k := range ks {
			walk(k.s, depth+1, k.link)
		}
	}
	for _, r := range roots {
		walk(r, 0, "")
	}
	return b.String()
}

// attrs prints kvs (only those in keys, in their order, when keys is set).
func attrs(kvs []attribute.KeyValue, keys []attribute.Key) string {
	var parts []string
	if keys == nil {
		for _, kv := range kvs {
			parts = append(parts, fmt.Sprintf("%s=%s", kv.Key, kv.Value.String()))
		}
	} else {
		for _, k := range keys {
			for _, kv := range kvs {
				if kv.Key == k {
					parts = append(parts, fmt.Sprintf("%s=%s", strings.TrimPrefix(string(k), "messaging."), kv.Value.String()))
				}
			}
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " " + strings.Join(parts, " ")
}

func status(s sdktrace.ReadOnlySpan) string {
	if st := s.Status(); st.Description != "" {
		return " status=" + st.Code.String() + " (" + st.Description + ")"
	}
	return ""
}

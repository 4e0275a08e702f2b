package kafka

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire"
	"github.com/ringfence/ringfence/adapters/kafka/internal/wire/wiretest"
	"github.com/ringfence/ringfence/consumer"
)

var testPart = consumer.Partition{Topic: "t", ID: 3}

var sameBytes = wiretest.SameBytes

// deliverSlices decodes data as a fetcher does and calls fn with each
// slice of messages built from it.
func deliverSlices(tb testing.TB, r *wire.BatchReader, sb *sliceBuilder, data []byte, fn func([]*consumer.Message)) {
	r.Reset(data, 0)
	for {
		hdrs, ok, err := r.Read(sb.slot(), sb.hdrs)
		sb.hdrs = hdrs
		if err != nil {
			tb.Fatal(err)
		}
		if !ok {
			if sb.n > 0 {
				fn(sb.build(testPart))
			}
			return
		}
		if sb.add() {
			fn(sb.build(testPart))
			r.Release()
		}
	}
}

// deliverAll returns every message deliverSlices builds from data.
func deliverAll(t testing.TB, data []byte) []*consumer.Message {
	t.Helper()
	var r wire.BatchReader
	var sb sliceBuilder
	var out []*consumer.Message
	deliverSlices(t, &r, &sb, data, func(ms []*consumer.Message) { out = append(out, ms...) })
	return out
}

// Messages keep what the records held, null apart from empty, with the
// partition they were fetched from.
func TestMessagesFromRecords(t *testing.T) {
	t.Parallel()
	b := wiretest.Batch{Base: 40, FirstTime: 1_700_000_000_000, LastDelta: -1}
	for i := range 2*deliverSlice + 5 {
		b.Recs = append(b.Recs, wiretest.Rec(int32(i), []byte(fmt.Sprint("k", i)), bytes.Repeat([]byte("v"), i*70),
			kmsg.Header{Key: "n"}, kmsg.Header{Key: "e", Value: []byte{}}, kmsg.Header{Key: fmt.Sprint("h", i), Value: []byte{byte(i)}}))
	}
	b.Recs[0].Key, b.Recs[1].Key = nil, []byte{}
	got := deliverAll(t, b.Encode(t, nil))
	want := b.Want(0)
	if len(got) != len(want) {
		t.Fatalf("%d messages, want %d", len(got), len(want))
	}
	for i, m := range got {
		w := want[i]
		if m.Offset != w.Offset || m.Time.UnixMilli() != w.Time || m.Partition != testPart || m.Topic != testPart.Topic ||
			!sameBytes(m.Key, w.Key) || !sameBytes(m.Value, w.Value) || len(m.Headers) != len(w.Headers) {
			t.Fatalf("message %d = %+v, want %+v", i, m, w)
		}
		for j, h := range m.Headers {
			if h.Key != w.Headers[j].Key || !sameBytes(h.Value, w.Headers[j].Value) {
				t.Fatalf("message %d header %d = %q=%q, want %q=%q", i, j, h.Key, h.Value, w.Headers[j].Key, w.Headers[j].Value)
			}
		}
	}
}

// A delivered message shares nothing with the fetch response, and a large
// value has an allocation of its own.
func TestMessagesCopyOutOfTheResponse(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("x"), largeValue+1)
	data := wiretest.Batch{LastDelta: -1, Recs: []kmsg.Record{
		wiretest.Rec(0, []byte("k0"), []byte("v0"), kmsg.Header{Key: "h", Value: []byte("hv")}),
		wiretest.Rec(1, []byte("k1"), big),
	}}.Encode(t, nil)
	got := deliverAll(t, data)
	orig := slices.Clone(data)
	for i := range data {
		data[i] = 0xee
	}
	want := deliverAll(t, orig)
	for i, g := range got {
		w := want[i]
		same := sameBytes(g.Key, w.Key) && sameBytes(g.Value, w.Value) && len(g.Headers) == len(w.Headers)
		for j := range g.Headers {
			same = same && g.Headers[j].Key == w.Headers[j].Key && sameBytes(g.Headers[j].Value, w.Headers[j].Value)
		}
		if !same {
			t.Fatalf("message %d changed with the response buffer", i)
		}
	}
	// Appending to one message's bytes never reaches its neighbour's.
	k0 := append(got[0].Key, 'X')
	if string(got[1].Key) != "k1" || string(k0) != "k0X" {
		t.Fatalf("append spilled into the arena: %q %q", got[1].Key, k0)
	}
	if cap(got[1].Value) != len(big) {
		t.Fatalf("large value shares an arena (cap %d)", cap(got[1].Value))
	}
}

// A slice of messages without headers costs three allocations (messages,
// pointers, arena); with headers, two more.
func TestSliceCostsFixedAllocations(t *testing.T) {
	value := bytes.Repeat([]byte("v"), 100)
	var plain, headed []kmsg.Record
	for i := range deliverSlice {
		plain = append(plain, wiretest.Rec(int32(i), []byte("tenant"), value))
		headed = append(headed, wiretest.Rec(int32(i), []byte("tenant"), value, kmsg.Header{Key: "a", Value: []byte("1")}, kmsg.Header{Key: "b"}))
	}
	for _, tt := range []struct {
		name string
		recs []kmsg.Record
		want float64
	}{{"no headers", plain, 3}, {"headers", headed, 5}} {
		data := wiretest.Batch{LastDelta: -1, Recs: tt.recs}.Encode(t, nil)
		var r wire.BatchReader
		var sb sliceBuilder
		allocs := testing.AllocsPerRun(100, func() { deliverSlices(t, &r, &sb, data, func([]*consumer.Message) {}) })
		if allocs != tt.want {
			t.Errorf("%s: %v allocations per slice, want %v", tt.name, allocs, tt.want)
		}
	}
}

// BenchmarkDecodeDeliver decodes and copies 1 MiB of records shaped like
// BenchmarkConsume's (100-byte values, 9-byte keys, batches of 1000).
func BenchmarkDecodeDeliver(b *testing.B) {
	value := make([]byte, 100)
	var data []byte
	var n int
	for base := int64(0); len(data) < 1<<20; base += 1000 {
		var recs []kmsg.Record
		for i := range 1000 {
			recs = append(recs, wiretest.Rec(int32(i), []byte(fmt.Sprintf("tenant-%02d", i%20)), value))
		}
		data = wiretest.Batch{Base: base, LastDelta: -1, Recs: recs}.Encode(b, data)
		n += len(recs)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var r wire.BatchReader
	var sb sliceBuilder
	for b.Loop() {
		deliverSlices(b, &r, &sb, data, func([]*consumer.Message) {})
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/msg")
}

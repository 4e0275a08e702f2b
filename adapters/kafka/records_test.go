package kafka

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/compress"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ringfence/ringfence/consumer"
)

// testBatch describes one record batch to encode with kmsg.
type testBatch struct {
	base          int64
	codec         compress.Compression
	control       bool
	logAppendTime bool
	firstTime     int64
	maxTime       int64
	lastDelta     int32 // -1: the last record's offset delta
	recs          []kmsg.Record
}

// encode appends b, as a broker stores it (CRC-32C included), to dst.
func (b testBatch) encode(t testing.TB, dst []byte) []byte {
	t.Helper()
	var raw []byte
	for _, r := range b.recs {
		r.Length = 0
		r.Length = int32(len(r.AppendTo(nil)) - 1) // a zero length takes one byte
		raw = r.AppendTo(raw)
	}
	if b.codec != compress.None {
		var buf bytes.Buffer
		w := b.codec.Codec().NewWriter(&buf)
		if _, err := w.Write(raw); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		raw = buf.Bytes()
	}
	attrs := int16(b.codec)
	if b.logAppendTime {
		attrs |= attrLogAppendTime
	}
	if b.control {
		attrs |= attrControl | 0x10 // control batches are transactional
	}
	last := b.lastDelta
	if last < 0 && len(b.recs) > 0 {
		last = b.recs[len(b.recs)-1].OffsetDelta
	}
	kb := kmsg.RecordBatch{
		FirstOffset: b.base, Magic: 2, Attributes: attrs, LastOffsetDelta: last,
		FirstTimestamp: b.firstTime, MaxTimestamp: b.maxTime,
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		NumRecords: int32(len(b.recs)), Records: raw,
	}
	enc := kb.AppendTo(nil)
	binary.BigEndian.PutUint32(enc[8:], uint32(len(enc)-batchLengthEnd))
	binary.BigEndian.PutUint32(enc[crcAt:], crc32.Checksum(enc[crcFrom:], castagnoli))
	return append(dst, enc...)
}

// want is what the source should deliver for b's records at from or
// later.
func (b testBatch) want(from int64) []*consumer.Message {
	if b.control {
		return nil
	}
	var out []*consumer.Message
	for _, r := range b.recs {
		off := b.base + int64(r.OffsetDelta)
		if off < from {
			continue
		}
		ts := b.firstTime + r.TimestampDelta64
		if b.logAppendTime {
			ts = b.maxTime
		}
		m := &consumer.Message{Key: r.Key, Value: r.Value, Offset: off, Time: time.UnixMilli(ts)}
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, consumer.Header{Key: h.Key, Value: h.Value})
		}
		out = append(out, m)
		from = off + 1
	}
	return out
}

var testPart = consumer.Partition{Topic: "t", ID: 3}

// decodeAll decodes batches from offset from as a fetch does, in slices.
func decodeAll(data []byte, from int64, maxInflated int) ([]*consumer.Message, int64, error) {
	return decodePaused(data, from, maxInflated, 0)
}

// decodePaused decodes data as a fetcher does, in slices of deliverSlice;
// with every > 0 it also stops after every every-th record, as when the
// engine pauses the partition, and goes on from the reader's rest at its
// next offset, as a resumed fetcher does.
func decodePaused(data []byte, from int64, maxInflated, every int) ([]*consumer.Message, int64, error) {
	r := batchReader{maxInflated: maxInflated}
	var sb sliceBuilder
	var out []*consumer.Message
	for rest, at := data, from; ; {
		r.reset(rest, at)
		for n := 1; ; n++ {
			hdrs, ok, err := r.read(sb.slot(), sb.hdrs)
			sb.hdrs = hdrs
			if !ok {
				if sb.n > 0 {
					out = append(out, sb.build(testPart)...)
				}
				return out, r.nextOffset(), err
			}
			full, pause := sb.add(), every > 0 && n%every == 0
			if full || pause {
				out = append(out, sb.build(testPart)...)
				r.release()
			}
			if pause {
				break
			}
		}
		rest, at = r.rest(), r.nextOffset()
	}
}

// sameMessages compares keys, values and headers with null apart from
// empty, offsets and times.
func sameMessages(got, want []*consumer.Message) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d messages, want %d", len(got), len(want))
	}
	for i, g := range got {
		w := want[i]
		switch {
		case g.Offset != w.Offset:
			return fmt.Errorf("message %d: offset %d, want %d", i, g.Offset, w.Offset)
		case !g.Time.Equal(w.Time):
			return fmt.Errorf("message %d: time %v, want %v", i, g.Time, w.Time)
		case !sameBytes(g.Key, w.Key):
			return fmt.Errorf("message %d: key %q (nil %v), want %q (nil %v)", i, g.Key, g.Key == nil, w.Key, w.Key == nil)
		case !sameBytes(g.Value, w.Value):
			return fmt.Errorf("message %d: value %q (nil %v), want %q (nil %v)", i, g.Value, g.Value == nil, w.Value, w.Value == nil)
		case len(g.Headers) != len(w.Headers):
			return fmt.Errorf("message %d: %d headers, want %d", i, len(g.Headers), len(w.Headers))
		case g.Partition != testPart || g.Topic != testPart.Topic:
			return fmt.Errorf("message %d: partition %v, topic %q", i, g.Partition, g.Topic)
		}
		for j, h := range g.Headers {
			if h.Key != w.Headers[j].Key || !sameBytes(h.Value, w.Headers[j].Value) {
				return fmt.Errorf("message %d header %d: %q=%q (nil %v), want %q=%q (nil %v)", i, j, h.Key, h.Value, h.Value == nil, w.Headers[j].Key, w.Headers[j].Value, w.Headers[j].Value == nil)
			}
		}
	}
	return nil
}

func sameBytes(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

func rec(delta int32, key, value []byte, headers ...kmsg.Header) kmsg.Record {
	return kmsg.Record{OffsetDelta: delta, TimestampDelta64: int64(delta) * 10, Key: key, Value: value, Headers: headers}
}

var codecs = []compress.Compression{compress.None, compress.Gzip, compress.Snappy, compress.Lz4, compress.Zstd}

func TestDecodeRecordBatches(t *testing.T) {
	t.Parallel()
	nullsAndEmpties := []kmsg.Record{
		rec(0, nil, nil),
		rec(1, []byte{}, []byte{}),
		rec(2, []byte("k"), []byte("v"), kmsg.Header{Key: "null", Value: nil}, kmsg.Header{Key: "empty", Value: []byte{}}, kmsg.Header{Key: "", Value: []byte("x")}),
		rec(3, []byte("big"), bytes.Repeat([]byte("0123456789"), 1000), kmsg.Header{Key: "big", Value: bytes.Repeat([]byte("h"), 5000)}),
	}
	for _, codec := range codecs {
		t.Run(codec.String(), func(t *testing.T) {
			t.Parallel()
			batches := []testBatch{
				{base: 100, codec: codec, firstTime: 1_700_000_000_000, lastDelta: -1, recs: nullsAndEmpties},
				{base: 104, codec: codec, control: true, lastDelta: -1, recs: []kmsg.Record{rec(0, []byte{0, 0, 0, 1}, []byte{0, 0, 0, 0, 0, 0})}},
				// compacted: offsets 105..109, records left at 106 and 108
				{base: 105, codec: codec, firstTime: 5, lastDelta: 4, recs: []kmsg.Record{rec(1, nil, []byte("a")), rec(3, nil, []byte("b"))}},
				{base: 110, codec: codec, logAppendTime: true, firstTime: 1, maxTime: 99, lastDelta: -1, recs: []kmsg.Record{rec(0, nil, []byte("c")), rec(1, nil, []byte("d"))}},
			}
			var data []byte
			var want []*consumer.Message
			lastLen := 0
			for _, b := range batches {
				n := len(data)
				data = b.encode(t, data)
				lastLen = len(data) - n
				want = append(want, b.want(0)...)
			}
			got, next, err := decodeAll(data, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := sameMessages(got, want); err != nil {
				t.Fatal(err)
			}
			if next != 112 {
				t.Fatalf("next offset %d, want 112", next)
			}
			// From inside the first batch: records below are skipped.
			got, _, err = decodeAll(data, 102, 0)
			if err != nil || len(got) == 0 || got[0].Offset != 102 {
				t.Fatalf("decode from 102: %v, first %v", err, got)
			}
			// A truncated last batch ends the records cleanly, at any cut.
			for cut := 1; cut <= lastLen; cut++ {
				got, next, err := decodeAll(data[:len(data)-cut], 0, 0)
				if err != nil || len(got) != len(want)-2 || next != 110 {
					t.Fatalf("cut %d: %d messages, next %d, %v; want %d, 110", cut, len(got), next, err, len(want)-2)
				}
			}
		})
	}
}

// Slices of 64 cross batch boundaries: a compressed batch's records handed
// out in a slice stay intact while the next batches are decompressed.
func TestDecodeManySmallBatches(t *testing.T) {
	t.Parallel()
	for _, codec := range codecs {
		var data []byte
		var want []*consumer.Message
		for b := range 50 {
			var recs []kmsg.Record
			for i := range 3 {
				recs = append(recs, rec(int32(i), []byte(fmt.Sprint("k", b, i)), bytes.Repeat([]byte{byte(b)}, 50+i)))
			}
			tb := testBatch{base: int64(b) * 3, codec: codec, lastDelta: -1, recs: recs}
			data = tb.encode(t, data)
			want = append(want, tb.want(0)...)
		}
		got, next, err := decodeAll(data, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := sameMessages(got, want); err != nil || next != 150 {
			t.Fatalf("%s: %v, next %d", codec, err, next)
		}
	}
}

func TestDecodeNullAndEmptyStayApart(t *testing.T) {
	t.Parallel()
	data := testBatch{lastDelta: -1, recs: []kmsg.Record{
		rec(0, nil, []byte{}, kmsg.Header{Key: "n"}, kmsg.Header{Key: "e", Value: []byte{}}),
		rec(1, []byte{}, nil),
	}}.encode(t, nil)
	got, _, err := decodeAll(data, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	m0, m1 := got[0], got[1]
	if m0.Key != nil || m0.Value == nil || m0.Headers[0].Value != nil || m0.Headers[1].Value == nil ||
		m1.Key == nil || m1.Value != nil {
		t.Fatalf("null and empty mixed up: %+v %+v", m0, m1)
	}
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	good := testBatch{base: 7, lastDelta: -1, recs: []kmsg.Record{rec(0, []byte("k"), []byte("v"))}}.encode(t, nil)
	legacy := slices.Clone(good)
	legacy[magicAt] = 1
	badCRC := slices.Clone(good)
	badCRC[len(badCRC)-1] ^= 1
	badCodec := slices.Clone(good)
	badCodec[22] |= 5
	binary.BigEndian.PutUint32(badCodec[crcAt:], crc32.Checksum(badCodec[crcFrom:], castagnoli))
	tooMany := slices.Clone(good)
	binary.BigEndian.PutUint32(tooMany[57:], 2)
	binary.BigEndian.PutUint32(tooMany[crcAt:], crc32.Checksum(tooMany[crcFrom:], castagnoli))
	tests := []struct {
		name string
		data []byte
		want error
		text string
		msgs int // delivered before the error
	}{
		{"legacy message format", legacy, errLegacyFormat, "magic 1", 2},
		{"bad CRC", badCRC, errMalformed, "CRC-32C", 2},
		{"unknown codec", badCodec, errMalformed, "codec 5", 2},
		// The batch's record is good: it is delivered before the error.
		{"more records declared than held", tooMany, errMalformed, "record length", 3},
	}
	for _, tt := range tests {
		// A good batch first: it is delivered, and the offset moves past it.
		data := append(testBatch{base: 5, lastDelta: -1, recs: []kmsg.Record{rec(0, nil, []byte("a")), rec(1, nil, []byte("b"))}}.encode(t, nil), tt.data...)
		got, next, err := decodeAll(data, 0, 0)
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
			t.Errorf("%s: %v; want %v mentioning %q", tt.name, err, tt.want, tt.text)
		}
		if len(got) != tt.msgs || next != 5+int64(tt.msgs) {
			t.Errorf("%s: %d messages before the error, next %d; want %d, %d", tt.name, len(got), next, tt.msgs, 5+tt.msgs)
		}
	}
}

// A delivered message shares nothing with the fetch response, and a large
// value has an allocation of its own.
func TestMessagesCopyOutOfTheResponse(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("x"), largeValue+1)
	data := testBatch{lastDelta: -1, recs: []kmsg.Record{
		rec(0, []byte("k0"), []byte("v0"), kmsg.Header{Key: "h", Value: []byte("hv")}),
		rec(1, []byte("k1"), big),
	}}.encode(t, nil)
	got, _, err := decodeAll(data, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	orig := slices.Clone(data)
	for i := range data {
		data[i] = 0xee
	}
	want, _, _ := decodeAll(orig, 0, 0)
	if err := sameMessages(got, want); err != nil {
		t.Fatalf("a message changed with the response buffer: %v", err)
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
func TestSliceAllocations(t *testing.T) {
	value := bytes.Repeat([]byte("v"), 100)
	var plain, headed []kmsg.Record
	for i := range deliverSlice {
		plain = append(plain, rec(int32(i), []byte("tenant"), value))
		headed = append(headed, rec(int32(i), []byte("tenant"), value, kmsg.Header{Key: "a", Value: []byte("1")}, kmsg.Header{Key: "b"}))
	}
	for _, tt := range []struct {
		name string
		recs []kmsg.Record
		want float64
	}{{"no headers", plain, 3}, {"headers", headed, 5}} {
		data := testBatch{lastDelta: -1, recs: tt.recs}.encode(t, nil)
		var r batchReader
		var sb sliceBuilder
		allocs := testing.AllocsPerRun(100, func() {
			r.reset(data, 0)
			for {
				hdrs, ok, err := r.read(sb.slot(), sb.hdrs)
				sb.hdrs = hdrs
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				if sb.add() {
					sb.build(testPart)
				}
			}
		})
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
			recs = append(recs, rec(int32(i), []byte(fmt.Sprintf("tenant-%02d", i%20)), value))
		}
		data = testBatch{base: base, lastDelta: -1, recs: recs}.encode(b, data)
		n += len(recs)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var r batchReader
	var sb sliceBuilder
	for b.Loop() {
		r.reset(data, 0)
		for {
			hdrs, ok, err := r.read(sb.slot(), sb.hdrs)
			sb.hdrs = hdrs
			if err != nil {
				b.Fatal(err)
			}
			if !ok {
				break
			}
			if sb.add() {
				sb.build(testPart)
				r.release()
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/msg")
}

package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire/wiretest"
)

type batch = wiretest.Batch

var rec = wiretest.Rec

// held is a record read and not yet copied out, as a caller holds it until
// it has gathered a slice of them.
type held struct {
	rec  Record
	hdrs []Header
}

// copyOut copies held records, as a caller does before Release.
func copyOut(hs []held) []wiretest.Want {
	var out []wiretest.Want
	for _, h := range hs {
		w := wiretest.Want{Offset: h.rec.Offset, Time: h.rec.Time, Key: bytes.Clone(h.rec.Key), Value: bytes.Clone(h.rec.Value)}
		for _, x := range h.hdrs {
			w.Headers = append(w.Headers, kmsg.Header{Key: string(x.Key), Value: bytes.Clone(x.Value)})
		}
		out = append(out, w)
	}
	return out
}

// decodeAll decodes batches from offset from, holding records in slices of
// 64 before it copies them out and releases them.
func decodeAll(data []byte, from int64, maxInflated int) ([]wiretest.Want, int64, error) {
	return decodePaused(data, from, maxInflated, 0)
}

// decodePaused is decodeAll that, with every > 0, also stops after every
// every-th record and goes on from the reader's Rest at its NextOffset, as
// a fetcher paused mid-response does once resumed.
func decodePaused(data []byte, from int64, maxInflated, every int) ([]wiretest.Want, int64, error) {
	r := BatchReader{MaxInflated: maxInflated}
	var out []wiretest.Want
	var slice []held
	for rest, at := data, from; ; {
		r.Reset(rest, at)
		for n := 1; ; n++ {
			var h held
			hdrs, ok, err := r.Read(&h.rec, nil)
			if !ok {
				out = append(out, copyOut(slice)...)
				return out, r.NextOffset(), err
			}
			h.hdrs = hdrs
			slice = append(slice, h)
			full, pause := len(slice) == 64, every > 0 && n%every == 0
			if full || pause {
				out = append(out, copyOut(slice)...)
				slice = slice[:0]
				r.Release()
			}
			if pause {
				break
			}
		}
		rest, at = r.Rest(), r.NextOffset()
	}
}

func wantAll(bs []batch, from int64) []wiretest.Want {
	var out []wiretest.Want
	for _, b := range bs {
		w := b.Want(from)
		out = append(out, w...)
		if len(w) > 0 {
			from = w[len(w)-1].Offset + 1
		}
	}
	return out
}

// sameRecords compares keys, values and headers with null apart from
// empty, offsets and times.
func sameRecords(got, want []wiretest.Want) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d records, want %d", len(got), len(want))
	}
	same := wiretest.SameBytes
	for i, g := range got {
		w := want[i]
		switch {
		case g.Offset != w.Offset:
			return fmt.Errorf("record %d: offset %d, want %d", i, g.Offset, w.Offset)
		case g.Time != w.Time:
			return fmt.Errorf("record %d: time %d, want %d", i, g.Time, w.Time)
		case !same(g.Key, w.Key):
			return fmt.Errorf("record %d: key %q (nil %v), want %q (nil %v)", i, g.Key, g.Key == nil, w.Key, w.Key == nil)
		case !same(g.Value, w.Value):
			return fmt.Errorf("record %d: value %q (nil %v), want %q (nil %v)", i, g.Value, g.Value == nil, w.Value, w.Value == nil)
		case len(g.Headers) != len(w.Headers):
			return fmt.Errorf("record %d: %d headers, want %d", i, len(g.Headers), len(w.Headers))
		}
		for j, h := range g.Headers {
			if h.Key != w.Headers[j].Key || !same(h.Value, w.Headers[j].Value) {
				return fmt.Errorf("record %d header %d: %q=%q (nil %v), want %q=%q (nil %v)", i, j, h.Key, h.Value, h.Value == nil, w.Headers[j].Key, w.Headers[j].Value, w.Headers[j].Value == nil)
			}
		}
	}
	return nil
}

func TestDecodeRecordBatches(t *testing.T) {
	t.Parallel()
	nullsAndEmpties := []kmsg.Record{
		rec(0, nil, nil),
		rec(1, []byte{}, []byte{}),
		rec(2, []byte("k"), []byte("v"), kmsg.Header{Key: "null", Value: nil}, kmsg.Header{Key: "empty", Value: []byte{}}, kmsg.Header{Key: "", Value: []byte("x")}),
		rec(3, []byte("big"), bytes.Repeat([]byte("0123456789"), 1000), kmsg.Header{Key: "big", Value: bytes.Repeat([]byte("h"), 5000)}),
	}
	for _, codec := range wiretest.Codecs {
		t.Run(codec.String(), func(t *testing.T) {
			t.Parallel()
			batches := []batch{
				{Base: 100, Codec: codec, FirstTime: 1_700_000_000_000, LastDelta: -1, Recs: nullsAndEmpties},
				{Base: 104, Codec: codec, Control: true, LastDelta: -1, Recs: []kmsg.Record{rec(0, []byte{0, 0, 0, 1}, []byte{0, 0, 0, 0, 0, 0})}},
				// compacted: offsets 105..109, records left at 106 and 108
				{Base: 105, Codec: codec, FirstTime: 5, LastDelta: 4, Recs: []kmsg.Record{rec(1, nil, []byte("a")), rec(3, nil, []byte("b"))}},
				{Base: 110, Codec: codec, LogAppendTime: true, FirstTime: 1, MaxTime: 99, LastDelta: -1, Recs: []kmsg.Record{rec(0, nil, []byte("c")), rec(1, nil, []byte("d"))}},
			}
			var data []byte
			lastLen := 0
			for _, b := range batches {
				n := len(data)
				data = b.Encode(t, data)
				lastLen = len(data) - n
			}
			want := wantAll(batches, 0)
			got, next, err := decodeAll(data, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := sameRecords(got, want); err != nil {
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
					t.Fatalf("cut %d: %d records, next %d, %v; want %d, 110", cut, len(got), next, err, len(want)-2)
				}
			}
		})
	}
}

// Slices of 64 cross batch boundaries: a compressed batch's records handed
// out and not yet released stay intact while the next batches are
// decompressed.
func TestDecodeManySmallBatches(t *testing.T) {
	t.Parallel()
	for _, codec := range wiretest.Codecs {
		var data []byte
		var bs []batch
		for b := range 50 {
			var recs []kmsg.Record
			for i := range 3 {
				recs = append(recs, rec(int32(i), []byte(fmt.Sprint("k", b, i)), bytes.Repeat([]byte{byte(b)}, 50+i)))
			}
			tb := batch{Base: int64(b) * 3, Codec: codec, LastDelta: -1, Recs: recs}
			data = tb.Encode(t, data)
			bs = append(bs, tb)
		}
		got, next, err := decodeAll(data, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := sameRecords(got, wantAll(bs, 0)); err != nil || next != 150 {
			t.Fatalf("%s: %v, next %d", codec, err, next)
		}
	}
}

func TestDecodeKeepsNullApartFromEmpty(t *testing.T) {
	t.Parallel()
	data := batch{LastDelta: -1, Recs: []kmsg.Record{
		rec(0, nil, []byte{}, kmsg.Header{Key: "n"}, kmsg.Header{Key: "e", Value: []byte{}}),
		rec(1, []byte{}, nil),
	}}.Encode(t, nil)
	var r BatchReader
	r.Reset(data, 0)
	var r0, r1 Record
	hdrs, ok0, err0 := r.Read(&r0, nil)
	_, ok1, err1 := r.Read(&r1, nil)
	if !ok0 || !ok1 || err0 != nil || err1 != nil {
		t.Fatalf("read: %v %v %v %v", ok0, ok1, err0, err1)
	}
	if r0.Key != nil || r0.Value == nil || hdrs[0].Value != nil || hdrs[1].Value == nil || r1.Key == nil || r1.Value != nil {
		t.Fatalf("null and empty mixed up: %+v %q %+v", r0, hdrs, r1)
	}
}

func TestDecodeRefusesMalformedBatches(t *testing.T) {
	t.Parallel()
	good := batch{Base: 7, LastDelta: -1, Recs: []kmsg.Record{rec(0, []byte("k"), []byte("v"))}}.Encode(t, nil)
	legacy := slices.Clone(good)
	legacy[magicAt] = 1
	badCRC := slices.Clone(good)
	badCRC[len(badCRC)-1] ^= 1
	badCodec := slices.Clone(good)
	badCodec[22] |= 5
	wiretest.Seal(badCodec)
	tooMany := slices.Clone(good)
	binary.BigEndian.PutUint32(tooMany[57:], 2)
	wiretest.Seal(tooMany)
	tests := []struct {
		name string
		data []byte
		want error
		text string
		recs int // returned before the error
	}{
		{"legacy message format", legacy, ErrLegacyFormat, "magic 1", 2},
		{"bad CRC", badCRC, ErrMalformed, "CRC-32C", 2},
		{"unknown codec", badCodec, ErrMalformed, "codec 5", 2},
		// The batch's record is good: it is returned before the error.
		{"more records declared than held", tooMany, ErrMalformed, "record length", 3},
	}
	for _, tt := range tests {
		// A good batch first: it is returned, and the offset moves past it.
		data := append(batch{Base: 5, LastDelta: -1, Recs: []kmsg.Record{rec(0, nil, []byte("a")), rec(1, nil, []byte("b"))}}.Encode(t, nil), tt.data...)
		got, next, err := decodeAll(data, 0, 0)
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
			t.Errorf("%s: %v; want %v mentioning %q", tt.name, err, tt.want, tt.text)
		}
		if len(got) != tt.recs || next != 5+int64(tt.recs) {
			t.Errorf("%s: %d records before the error, next %d; want %d, %d", tt.name, len(got), next, tt.recs, 5+tt.recs)
		}
	}
}

// A fetch walk stops where fn says, at the offset of the record it
// refused, and passes control records.
func TestWalkStopsWhereFnSays(t *testing.T) {
	t.Parallel()
	data := batch{Base: 10, LastDelta: -1, Recs: []kmsg.Record{rec(0, nil, []byte("a")), rec(1, nil, []byte("b")), rec(2, nil, []byte("c"))}}.Encode(t, nil)
	data = batch{Base: 13, Control: true, LastDelta: -1, Recs: []kmsg.Record{rec(0, []byte{0, 0, 0, 1}, []byte{0, 0, 0, 0, 0, 0})}}.Encode(t, data)
	var seen []string
	next, err := walk(data, 11, func(r *Record, _ []Header) error {
		seen = append(seen, string(r.Value))
		return nil
	})
	if err != nil || next != 14 || !slices.Equal(seen, []string{"b", "c"}) {
		t.Fatalf("walk from 11 = %q, next %d, %v; want b c, next 14 (past the marker)", seen, next, err)
	}
	boom := errors.New("boom")
	for _, tt := range []struct {
		stop error
		want error
	}{{ErrStop, nil}, {boom, boom}} {
		next, err := walk(data, 10, func(r *Record, _ []Header) error {
			if string(r.Value) == "b" {
				return tt.stop
			}
			return nil
		})
		if next != 11 || !errors.Is(err, tt.want) || tt.want == nil && err != nil {
			t.Fatalf("walk stopped by %v: next %d, %v; want 11, %v", tt.stop, next, err, tt.want)
		}
	}
}

// Package wiretest encodes record batches as a broker stores them, for the
// tests of the record decoder and of what is built from its records.
package wiretest

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/segmentio/kafka-go/compress"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Codecs are the compression codecs a batch may use.
var Codecs = []compress.Compression{compress.None, compress.Gzip, compress.Snappy, compress.Lz4, compress.Zstd}

// A Batch describes one record batch (message format v2) to encode.
type Batch struct {
	Base          int64
	Codec         compress.Compression
	Control       bool
	LogAppendTime bool
	FirstTime     int64
	MaxTime       int64
	LastDelta     int32 // -1: the last record's offset delta
	Recs          []kmsg.Record
}

// Rec is a record at offset delta with a timestamp delta of 10ms per
// offset.
func Rec(delta int32, key, value []byte, headers ...kmsg.Header) kmsg.Record {
	return kmsg.Record{OffsetDelta: delta, TimestampDelta64: int64(delta) * 10, Key: key, Value: value, Headers: headers}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Encode appends b, as a broker stores it (CRC-32C included), to dst.
func (b Batch) Encode(t testing.TB, dst []byte) []byte {
	t.Helper()
	var raw []byte
	for _, r := range b.Recs {
		r.Length = 0
		r.Length = int32(len(r.AppendTo(nil)) - 1) // a zero length takes one byte
		raw = r.AppendTo(raw)
	}
	if b.Codec != compress.None {
		var buf bytes.Buffer
		w := b.Codec.Codec().NewWriter(&buf)
		if _, err := w.Write(raw); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		raw = buf.Bytes()
	}
	attrs := int16(b.Codec)
	if b.LogAppendTime {
		attrs |= 0x08
	}
	if b.Control {
		attrs |= 0x20 | 0x10 // control batches are transactional
	}
	last := b.LastDelta
	if last < 0 && len(b.Recs) > 0 {
		last = b.Recs[len(b.Recs)-1].OffsetDelta
	}
	kb := kmsg.RecordBatch{
		FirstOffset: b.Base, Magic: 2, Attributes: attrs, LastOffsetDelta: last,
		FirstTimestamp: b.FirstTime, MaxTimestamp: b.MaxTime,
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		NumRecords: int32(len(b.Recs)), Records: raw,
	}
	enc := kb.AppendTo(nil)
	binary.BigEndian.PutUint32(enc[8:], uint32(len(enc)-12))
	Seal(enc)
	return append(dst, enc...)
}

// Seal writes the CRC-32C of batch, a whole encoded batch, into its header.
func Seal(batch []byte) {
	binary.BigEndian.PutUint32(batch[17:], crc32.Checksum(batch[21:], castagnoli))
}

// A Want is a data record as a decoder should return it.
type Want struct {
	Offset  int64
	Time    int64 // milliseconds
	Key     []byte
	Value   []byte
	Headers []kmsg.Header
}

// Want is what a decoder should return of b's records at from or later.
func (b Batch) Want(from int64) []Want {
	if b.Control {
		return nil
	}
	var out []Want
	for _, r := range b.Recs {
		off := b.Base + int64(r.OffsetDelta)
		if off < from {
			continue
		}
		ts := b.FirstTime + r.TimestampDelta64
		if b.LogAppendTime {
			ts = b.MaxTime
		}
		out = append(out, Want{Offset: off, Time: ts, Key: r.Key, Value: r.Value, Headers: r.Headers})
		from = off + 1
	}
	return out
}

// SameBytes reports whether a and b are equal with null apart from empty.
func SameBytes(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

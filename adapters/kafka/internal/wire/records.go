package wire

// Decoding the record batches of a fetch response (message format v2,
// magic 2, Kafka 0.11 and later). Records are returned one at a time with
// their keys, values and headers pointing into the response (or into the
// decompressed copy of a compressed batch); callers copy out what they
// keep. Everything is bounds-checked: malformed input is an error, never a
// panic, and no length or count read from the input sizes an allocation.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"

	"github.com/segmentio/kafka-go/compress"
)

// ErrMalformed is wrapped by every error for a record batch that cannot be
// decoded (bad lengths, bad CRC, an unknown codec, a corrupt record).
var ErrMalformed = errors.New("kafka: malformed record batch")

// ErrLegacyFormat is wrapped by the error for a message set in the legacy
// message format (v0/v1, magic 0 or 1), which the decoder does not read.
var ErrLegacyFormat = errors.New("kafka: legacy message format (magic 0/1) is not supported; the topic must use message format v2 (Kafka 0.11+)")

const (
	// batchHeaderLen is a v2 batch's header: baseOffset (8), batchLength
	// (4), partitionLeaderEpoch (4), magic (1), crc (4), attributes (2),
	// lastOffsetDelta (4), baseTimestamp (8), maxTimestamp (8), producerId
	// (8), producerEpoch (2), baseSequence (4), record count (4).
	batchHeaderLen = 61
	// batchLengthEnd is where batchLength starts counting: a batch takes
	// batchLengthEnd+batchLength bytes.
	batchLengthEnd = 12
	// magicAt and crcFrom: the magic byte (at the same place in legacy
	// message sets) and the start of what the CRC covers (attributes on).
	magicAt = 16
	crcAt   = 17
	crcFrom = 21

	attrCodec         = 0x07
	attrLogAppendTime = 0x08
	attrControl       = 0x20

	// defaultMaxInflated bounds one batch's decompressed records.
	defaultMaxInflated = 256 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// A Record is one decoded data record. Key, Value and the headers point
// into the fetch response or the BatchReader's decompressed buffer; nil is
// null, apart from empty.
type Record struct {
	Offset  int64
	Time    int64 // milliseconds since the epoch
	Key     []byte
	Value   []byte
	Headers int // how many headers Read appended
}

// A Header is a record header; Value nil is null.
type Header struct {
	Key, Value []byte
}

// A BatchReader reads the data records of a fetch response's record
// batches in order. A truncated last batch (a broker cuts the response at
// MaxBytes) ends the records cleanly. The zero value is ready for Reset.
type BatchReader struct {
	buf  []byte // the batches after the current one
	next int64  // the offset after every record passed so far (see Read)

	// MaxInflated bounds one batch's decompressed records; 0 means 256 MiB.
	MaxInflated int
	inflated    []byte // decompressed records of the current batch and earlier ones
	// reuse says no record handed out since the last release points into
	// inflated, so the next compressed batch may overwrite it.
	reuse bool
	src   bytes.Reader

	// The current batch.
	cur           []byte // it and the batches after it (see Rest)
	recs          []byte // its records not yet read
	left          int32  // how many
	inBatch       bool
	base          int64
	baseTime      int64
	maxTime       int64
	end           int64 // baseOffset + lastOffsetDelta + 1
	logAppendTime bool
	control       bool
	compressed    bool
}

// Reset starts reading batches b for records at offset from or later.
// Reset(nil, 0) drops the references to the last response, and a
// decompression buffer grown past 8 MiB.
func (r *BatchReader) Reset(b []byte, from int64) {
	r.buf, r.next = b, from
	r.cur, r.recs, r.left, r.inBatch = nil, nil, 0, false
	r.reuse = true
	if b == nil {
		r.src.Reset(nil)
		if cap(r.inflated) > 8<<20 {
			r.inflated = nil
		}
	}
}

// Release tells r that no record it returned is referenced any more (they
// were copied out), so its decompression buffer may be reused.
func (r *BatchReader) Release() { r.reuse = true }

// NextOffset is the offset to fetch after the records read so far: past the
// last record returned, past skipped control records, and past the end of
// every batch read to its end (a compacted batch may hold fewer records
// than its offset range).
func (r *BatchReader) NextOffset() int64 { return r.next }

// Rest returns the batches not read to their end: the current one, whole
// (Reset(Rest(), NextOffset()) passes over its records already read), and those
// after it. It is nil at the end and after an error.
func (r *BatchReader) Rest() []byte {
	if r.inBatch {
		return r.cur
	}
	return r.buf
}

// Read reads the next data record at NextOffset or later into rec,
// appending its headers to hdrs. ok is false at the end of the batches.
// Records below NextOffset (a batch may start before the fetch offset) and
// control records (a transaction's markers) are passed over, the latter
// moving NextOffset past them. After an error the reader is done.
func (r *BatchReader) Read(rec *Record, hdrs []Header) (_ []Header, ok bool, err error) {
	for {
		if r.left == 0 {
			if r.inBatch {
				r.inBatch = false
				if len(r.recs) != 0 {
					return hdrs, false, r.fail("%d bytes after its last record", len(r.recs))
				}
				if r.end > r.next {
					r.next = r.end
				}
			}
			if ok, err := r.startBatch(); !ok || err != nil {
				return hdrs, false, err
			}
			continue
		}
		n := len(hdrs)
		hdrs, err = r.readRecord(rec, hdrs)
		if err != nil {
			*rec = Record{}
			return hdrs[:n], false, err
		}
		r.left--
		if rec.Offset < r.next {
			hdrs = hdrs[:n]
			continue
		}
		r.next = rec.Offset + 1
		if r.control {
			hdrs = hdrs[:n]
			continue
		}
		if r.compressed {
			r.reuse = false
		}
		return hdrs, true, nil
	}
}

// fail ends the reader with an error about the current batch.
func (r *BatchReader) fail(format string, args ...any) error {
	r.buf, r.cur, r.recs, r.left, r.inBatch = nil, nil, nil, 0, false
	return fmt.Errorf("%w at offset %d: %s", ErrMalformed, r.base, fmt.Sprintf(format, args...))
}

// startBatch reads the next batch's header; false at the end.
func (r *BatchReader) startBatch() (bool, error) {
	b := r.buf
	if len(b) < batchLengthEnd {
		r.buf = nil
		return false, nil
	}
	r.base = int64(binary.BigEndian.Uint64(b))
	length := int64(int32(binary.BigEndian.Uint32(b[8:])))
	if length < 0 {
		return false, r.fail("negative batch length %d", length)
	}
	if length > int64(len(b)-batchLengthEnd) {
		r.buf = nil // truncated: the broker cut the response here
		return false, nil
	}
	if length < magicAt+1-batchLengthEnd {
		return false, r.fail("batch length %d too short", length)
	}
	switch magic := int8(b[magicAt]); {
	case magic == 0 || magic == 1:
		r.buf = nil
		return false, fmt.Errorf("%w: a message set at offset %d has magic %d", ErrLegacyFormat, r.base, magic)
	case magic != 2:
		return false, r.fail("unknown magic %d", magic)
	}
	if length < batchHeaderLen-batchLengthEnd {
		return false, r.fail("batch length %d too short for a v2 batch header", length)
	}
	batch := b[:batchLengthEnd+length]
	r.cur, r.buf = b, b[batchLengthEnd+length:]
	if want, got := binary.BigEndian.Uint32(batch[crcAt:]), crc32.Checksum(batch[crcFrom:], castagnoli); want != got {
		return false, r.fail("CRC-32C mismatch: the batch says %08x, its bytes give %08x", want, got)
	}
	attrs := binary.BigEndian.Uint16(batch[21:])
	lastDelta := int32(binary.BigEndian.Uint32(batch[23:]))
	r.baseTime = int64(binary.BigEndian.Uint64(batch[27:]))
	r.maxTime = int64(binary.BigEndian.Uint64(batch[35:]))
	count := int32(binary.BigEndian.Uint32(batch[57:]))
	if count < 0 {
		return false, r.fail("negative record count %d", count)
	}
	r.end = r.base
	if lastDelta >= 0 && r.base <= math.MaxInt64-int64(lastDelta)-1 {
		r.end = r.base + int64(lastDelta) + 1
	}
	r.logAppendTime = attrs&attrLogAppendTime != 0
	r.control = attrs&attrControl != 0
	recs := batch[batchHeaderLen:]
	codec := compress.Compression(attrs & attrCodec)
	switch {
	case codec == compress.None:
		r.recs, r.compressed = recs, false
	case codec.Codec() != nil:
		var err error
		if r.recs, err = r.inflate(codec, recs); err != nil {
			return false, r.fail("%s decompression: %v", codec, err)
		}
		r.compressed = true
	default:
		return false, r.fail("unknown compression codec %d", codec)
	}
	r.left, r.inBatch = count, true
	return true, nil
}

// inflate decompresses a batch's records onto r.inflated, from its start
// when no record handed out points into it.
func (r *BatchReader) inflate(codec compress.Compression, recs []byte) ([]byte, error) {
	if r.reuse {
		r.inflated = r.inflated[:0]
	}
	limit := r.MaxInflated
	if limit <= 0 {
		limit = defaultMaxInflated
	}
	r.src.Reset(recs)
	dec := codec.Codec().NewReader(&r.src)
	start := len(r.inflated)
	var err error
	r.inflated, err = appendAll(r.inflated, dec, limit)
	_ = dec.Close()
	if err != nil {
		return nil, err
	}
	return r.inflated[start:len(r.inflated):len(r.inflated)], nil
}

// appendAll appends what rd yields to dst, failing past limit bytes.
func appendAll(dst []byte, rd io.Reader, limit int) ([]byte, error) {
	start := len(dst)
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := rd.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if len(dst)-start > limit {
			return dst, fmt.Errorf("more than %d bytes", limit)
		}
		if errors.Is(err, io.EOF) {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// readRecord reads one record of the current batch into rec.
func (r *BatchReader) readRecord(rec *Record, hdrs []Header) ([]Header, error) {
	length, n := varint(r.recs)
	if n <= 0 || length < 0 || length > int64(len(r.recs)-n) {
		return hdrs, r.fail("bad record length (%d records and %d bytes left)", r.left, len(r.recs))
	}
	body := r.recs[n : n+int(length) : n+int(length)]
	r.recs = r.recs[n+int(length):]
	if len(body) == 0 {
		return hdrs, r.fail("empty record")
	}
	p := 1 // attributes: unused
	tsDelta, n := varint(body[p:])
	if n <= 0 {
		return hdrs, r.fail("bad record timestamp delta")
	}
	p += n
	offDelta, n := varint(body[p:])
	if n <= 0 || offDelta < math.MinInt32 || offDelta > math.MaxInt32 {
		return hdrs, r.fail("bad record offset delta")
	}
	p += n
	rec.Offset = r.base + offDelta
	if offDelta >= 0 && rec.Offset < r.base || offDelta < 0 && rec.Offset > r.base || rec.Offset == math.MaxInt64 {
		return hdrs, r.fail("record offset out of range")
	}
	if r.logAppendTime {
		rec.Time = r.maxTime
	} else {
		rec.Time = r.baseTime + tsDelta
	}
	var err error
	if rec.Key, p, err = varBytes(body, p, true); err != nil {
		return hdrs, r.fail("record key: %v", err)
	}
	if rec.Value, p, err = varBytes(body, p, true); err != nil {
		return hdrs, r.fail("record value: %v", err)
	}
	count, n := varint(body[p:])
	if n <= 0 || count < 0 || count > int64(len(body)-p-n)/2 {
		return hdrs, r.fail("bad record header count")
	}
	p += n
	for range count {
		var h Header
		if h.Key, p, err = varBytes(body, p, false); err != nil {
			return hdrs, r.fail("record header key: %v", err)
		}
		if h.Value, p, err = varBytes(body, p, true); err != nil {
			return hdrs, r.fail("record header value: %v", err)
		}
		hdrs = append(hdrs, h)
	}
	if p != len(body) {
		return hdrs, r.fail("%d bytes after a record's headers", len(body)-p)
	}
	rec.Headers = int(count)
	return hdrs, nil
}

// varBytes reads a varint-length byte string of b at p: nil for length -1
// if nullable. It returns the position after it.
func varBytes(b []byte, p int, nullable bool) ([]byte, int, error) {
	l, n := varint(b[p:])
	if n <= 0 {
		return nil, p, errors.New("bad length")
	}
	p += n
	switch {
	case l == -1 && nullable:
		return nil, p, nil
	case l < 0 || l > int64(len(b)-p):
		return nil, p, fmt.Errorf("length %d with %d bytes left", l, len(b)-p)
	}
	end := p + int(l)
	return b[p:end:end], end, nil
}

// varint reads a zig-zag varint (Kafka's varint and varlong); n <= 0 if b
// does not hold one. One- and two-byte varints (lengths up to 8191) take
// the fast path.
func varint(b []byte) (int64, int) {
	if len(b) > 0 && b[0] < 0x80 {
		x := int64(b[0])
		return x>>1 ^ -(x & 1), 1
	}
	if len(b) > 1 && b[1] < 0x80 {
		x := int64(b[0]&0x7f) | int64(b[1])<<7
		return x>>1 ^ -(x & 1), 2
	}
	return binary.Varint(b)
}

package kafka

// Decoding the record batches of a fetch response (message format v2,
// magic 2, Kafka 0.11 and later) for the source's fetch path (fetch.go).
// Records are returned one at a time with their keys, values and headers
// pointing into the response (or into the decompressed copy of a
// compressed batch); fetch.go copies what it delivers out of them (see
// messages.go). Everything is bounds-checked: malformed input is an error,
// never a panic, and no length or count read from the input sizes an
// allocation.

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

// errMalformed is wrapped by every error for a record batch that cannot be
// decoded (bad lengths, bad CRC, an unknown codec, a corrupt record).
var errMalformed = errors.New("kafka: malformed record batch")

// errLegacyFormat is wrapped by the error for a message set in the legacy
// message format (v0/v1, magic 0 or 1), which the source does not read.
var errLegacyFormat = errors.New("kafka: legacy message format (magic 0/1) is not supported; the topic must use message format v2 (Kafka 0.11+)")

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

// record is one decoded data record. key, value and the headers point into
// the fetch response or batchReader's decompressed buffer; nil is null.
type fetchedRecord struct {
	offset  int64
	time    int64 // milliseconds since the epoch
	key     []byte
	value   []byte
	headers int // how many headers read appended
}

// recordHeader is a record header; value nil is null.
type recordHeader struct {
	key, value []byte
}

// batchReader reads the data records of a fetch response's record batches
// in order. A truncated last batch (a broker cuts the response at MaxBytes)
// ends the records cleanly.
type batchReader struct {
	buf  []byte // the batches after the current one
	next int64  // the offset after every record passed so far (see read)

	maxInflated int    // 0: defaultMaxInflated
	inflated    []byte // decompressed records of the current batch and earlier ones
	// reuse says no record handed out since the last release points into
	// inflated, so the next compressed batch may overwrite it.
	reuse bool
	src   bytes.Reader

	// The current batch.
	cur           []byte // it and the batches after it (see rest)
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

// reset starts reading batches b for records at offset from or later.
// reset(nil, 0) drops the references to the last response, and a
// decompression buffer grown past 8 MiB.
func (r *batchReader) reset(b []byte, from int64) {
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

// release tells r that no record it returned is referenced any more (they
// were copied out), so its decompression buffer may be reused.
func (r *batchReader) release() { r.reuse = true }

// nextOffset is the offset to fetch after the records read so far: past the
// last record returned, past skipped control records, and past the end of
// every batch read to its end (a compacted batch may hold fewer records
// than its offset range).
func (r *batchReader) nextOffset() int64 { return r.next }

// rest returns the batches not read to their end: the current one, whole
// (reset(rest, nextOffset) passes over its records already read), and those
// after it. It is nil at the end and after an error.
func (r *batchReader) rest() []byte {
	if r.inBatch {
		return r.cur
	}
	return r.buf
}

// read reads the next data record at nextOffset or later into rec,
// appending its headers to hdrs. ok is false at the end of the batches.
// Records below nextOffset (a batch may start before the fetch offset) and
// control records (a transaction's markers) are passed over, the latter
// moving nextOffset past them. After an error the reader is done.
func (r *batchReader) read(rec *fetchedRecord, hdrs []recordHeader) (_ []recordHeader, ok bool, err error) {
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
			*rec = fetchedRecord{}
			return hdrs[:n], false, err
		}
		r.left--
		if rec.offset < r.next {
			hdrs = hdrs[:n]
			continue
		}
		r.next = rec.offset + 1
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
func (r *batchReader) fail(format string, args ...any) error {
	r.buf, r.cur, r.recs, r.left, r.inBatch = nil, nil, nil, 0, false
	return fmt.Errorf("%w at offset %d: %s", errMalformed, r.base, fmt.Sprintf(format, args...))
}

// startBatch reads the next batch's header; false at the end.
func (r *batchReader) startBatch() (bool, error) {
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
		return false, fmt.Errorf("%w: a message set at offset %d has magic %d", errLegacyFormat, r.base, magic)
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
func (r *batchReader) inflate(codec compress.Compression, recs []byte) ([]byte, error) {
	if r.reuse {
		r.inflated = r.inflated[:0]
	}
	limit := r.maxInflated
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
func (r *batchReader) readRecord(rec *fetchedRecord, hdrs []recordHeader) ([]recordHeader, error) {
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
	rec.offset = r.base + offDelta
	if offDelta >= 0 && rec.offset < r.base || offDelta < 0 && rec.offset > r.base || rec.offset == math.MaxInt64 {
		return hdrs, r.fail("record offset out of range")
	}
	if r.logAppendTime {
		rec.time = r.maxTime
	} else {
		rec.time = r.baseTime + tsDelta
	}
	var err error
	if rec.key, p, err = varBytes(body, p, true); err != nil {
		return hdrs, r.fail("record key: %v", err)
	}
	if rec.value, p, err = varBytes(body, p, true); err != nil {
		return hdrs, r.fail("record value: %v", err)
	}
	count, n := varint(body[p:])
	if n <= 0 || count < 0 || count > int64(len(body)-p-n)/2 {
		return hdrs, r.fail("bad record header count")
	}
	p += n
	for range count {
		var h recordHeader
		if h.key, p, err = varBytes(body, p, false); err != nil {
			return hdrs, r.fail("record header key: %v", err)
		}
		if h.value, p, err = varBytes(body, p, true); err != nil {
			return hdrs, r.fail("record header value: %v", err)
		}
		hdrs = append(hdrs, h)
	}
	if p != len(body) {
		return hdrs, r.fail("%d bytes after a record's headers", len(body)-p)
	}
	rec.headers = int(count)
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

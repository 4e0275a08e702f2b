package kafka

import (
	"math/bits"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// kgoPools lends kgo the slabs it decodes fetched records into and the
// buffers it decompresses batches into (the GroupSource's fetchers pass it
// to kgo.ProcessFetchPartition and kgo.DefaultDecompressor). The
// GroupSource builds engine messages of every record before it recycles it
// (recordSlicer), and kgo takes a slab and its buffer back only once every
// record of the batch was recycled, so nothing a message holds is ever
// reused. A record never recycled (its partition was revoked while it was
// kept back) leaves its slab to the collector.
//
// Both are pooled by power-of-two capacity class; a request over the
// largest class is allocated and left to the collector.
type kgoPools struct {
	recs  [maxRecClass + 1]sync.Pool  // of []kgo.Record, capacity 1<<class
	bytes [maxByteClass + 1]sync.Pool // of []byte, capacity 1<<class
}

const (
	maxRecClass  = 14 // slabs of up to 16384 records
	maxByteClass = 24 // decompression buffers of up to 16 MiB
	// decompressGuess is how many times its compressed size a batch is
	// expected to grow to; kgo grows a buffer that was too small.
	decompressGuess = 4
)

// classOf is the smallest class whose capacity holds n.
func classOf(n int) int {
	if n <= 1 {
		return 0
	}
	return bits.Len(uint(n - 1))
}

// GetRecords implements kgo.PoolRecords.
func (p *kgoPools) GetRecords(n int) []kgo.Record {
	c := classOf(n)
	if c > maxRecClass {
		return make([]kgo.Record, 0, n)
	}
	if v := p.recs[c].Get(); v != nil {
		return v.([]kgo.Record)[:0]
	}
	return make([]kgo.Record, 0, 1<<c)
}

// PutRecords implements kgo.PoolRecords. Recycle zeroed what was kept;
// clearing all keeps a pooled slab from pinning a response through a
// record kgo decoded but did not keep.
func (p *kgoPools) PutRecords(rs []kgo.Record) {
	rs = rs[:cap(rs)]
	c := bits.Len(uint(len(rs))) - 1 // the class the capacity fills
	if c < 0 || c > maxRecClass {
		return
	}
	clear(rs)
	//lint:ignore SA6002 a slice header: one small allocation per batch
	p.recs[c].Put(rs[:1<<c])
}

// GetDecompressBytes implements kgo.PoolDecompressBytes.
func (p *kgoPools) GetDecompressBytes(compressed []byte, _ kgo.CompressionCodecType) []byte {
	n := len(compressed) * decompressGuess
	c := classOf(n)
	if c > maxByteClass {
		return make([]byte, 0, n)
	}
	if v := p.bytes[c].Get(); v != nil {
		return v.([]byte)[:0]
	}
	return make([]byte, 0, 1<<c)
}

// PutDecompressBytes implements kgo.PoolDecompressBytes (kgo zeroed the
// bytes used).
func (p *kgoPools) PutDecompressBytes(b []byte) {
	c := bits.Len(uint(cap(b))) - 1
	if c < 0 || c > maxByteClass {
		return
	}
	//lint:ignore SA6002 a slice header: one small allocation per batch
	p.bytes[c].Put(b[: 0 : 1<<c])
}

var (
	_ kgo.PoolRecords         = (*kgoPools)(nil)
	_ kgo.PoolDecompressBytes = (*kgoPools)(nil)
)

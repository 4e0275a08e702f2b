package kafka

// Turning the records of one delivered slice (up to deliverSlice of them)
// into consumer.Messages that share nothing with the fetch response, whose
// buffer is reused by the partition's next fetch. The engine may keep a
// message for long (a stuck tenant), so what one message pins stays small:
// the slice's messages are one []consumer.Message, their keys, values and
// header values one arena, and their header keys one string; a key, value
// or header value over largeValue bytes gets an allocation of its own. A kept
// message thus pins at most its slice's small neighbours, never the
// response (up to MaxBytes) or a large neighbour. A slice without headers
// costs three allocations: messages, pointers and arena.

import (
	"time"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire"
	"github.com/ringfence/ringfence/consumer"
)

// largeValue is the largest key, value or header value copied into a
// slice's shared arena.
const largeValue = 4 << 10

// sliceBuilder gathers the records of the slice being read.
type sliceBuilder struct {
	recs [deliverSlice]wire.Record
	n    int
	hdrs []wire.Header // the headers of recs, in order
	keys []byte        // scratch: the header keys of the slice
}

// slot is where the next record is read.
func (b *sliceBuilder) slot() *wire.Record { return &b.recs[b.n] }

// add takes the record read into slot, whose headers are already at the
// end of b.hdrs; it reports whether the slice is full.
func (b *sliceBuilder) add() bool {
	b.n++
	return b.n == deliverSlice
}

// build copies the gathered records into messages of partition p, and
// empties b.
func (b *sliceBuilder) build(p consumer.Partition) []*consumer.Message {
	recs := b.recs[:b.n]
	arena, keys := 0, 0
	for i := range recs {
		arena += small(recs[i].Key) + small(recs[i].Value)
	}
	for _, h := range b.hdrs {
		arena += small(h.Value)
		keys += len(h.Key)
	}
	ms := make([]consumer.Message, len(recs))
	out := make([]*consumer.Message, len(recs))
	var buf []byte
	if arena > 0 {
		buf = make([]byte, 0, arena)
	}
	var hs []consumer.Header
	var ks string
	if len(b.hdrs) > 0 {
		hs = make([]consumer.Header, len(b.hdrs))
		b.keys = b.keys[:0]
		for _, h := range b.hdrs {
			b.keys = append(b.keys, h.Key...)
		}
		ks = string(b.keys)
	}
	h, k := 0, 0
	for i := range recs {
		r := &recs[i]
		m := &ms[i]
		m.Topic, m.Partition, m.Offset, m.Time = p.Topic, p, r.Offset, time.UnixMilli(r.Time)
		m.Key, buf = place(buf, r.Key)
		m.Value, buf = place(buf, r.Value)
		if r.Headers > 0 {
			mh := hs[h : h+r.Headers : h+r.Headers]
			for j := range mh {
				src := &b.hdrs[h+j]
				mh[j].Key = ks[k : k+len(src.Key)]
				k += len(src.Key)
				mh[j].Value, buf = place(buf, src.Value)
			}
			m.Headers = mh
			h += r.Headers
		}
		out[i] = m
	}
	b.reset()
	return out
}

// reset empties b and drops its references into the fetch response.
func (b *sliceBuilder) reset() {
	clear(b.recs[:b.n])
	clear(b.hdrs)
	b.n, b.hdrs = 0, b.hdrs[:0]
}

func small(v []byte) int {
	if len(v) > largeValue {
		return 0
	}
	return len(v)
}

// place copies v into the arena (capped, so that appending to one message's
// bytes never overwrites another's), or into its own allocation if large.
// Null stays nil; empty stays empty and non-nil.
func place(arena, v []byte) ([]byte, []byte) {
	switch {
	case v == nil:
		return nil, arena
	case len(v) == 0:
		return []byte{}, arena
	case len(v) > largeValue:
		own := make([]byte, len(v))
		copy(own, v)
		return own, arena
	}
	start := len(arena)
	arena = append(arena, v...)
	return arena[start:len(arena):len(arena)], arena
}

package kafka

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ringfence/ringfence/consumer"
)

// recordSlicer copies a slice of kgo records into engine messages: one
// allocation for the messages, one for their pointers, one arena for their
// small keys, values and header values (each over largeValue gets its
// own), one for their headers. A message the engine keeps for long so pins
// its slice's small neighbours, not kgo's whole fetch response. Null stays
// nil and empty stays empty, as in Source.
type recordSlicer struct{}

func (recordSlicer) build(p consumer.Partition, recs []*kgo.Record) []*consumer.Message {
	arena, nh := 0, 0
	for _, r := range recs {
		arena += small(r.Key) + small(r.Value)
		for _, h := range r.Headers {
			arena += small(h.Value)
		}
		nh += len(r.Headers)
	}
	ms := make([]consumer.Message, len(recs))
	out := make([]*consumer.Message, len(recs))
	var buf []byte
	if arena > 0 {
		buf = make([]byte, 0, arena)
	}
	var hs []consumer.Header
	if nh > 0 {
		hs = make([]consumer.Header, nh)
	}
	h := 0
	for i, r := range recs {
		m := &ms[i]
		m.Topic, m.Partition, m.Offset, m.Time = p.Topic, p, r.Offset, r.Timestamp
		m.Key, buf = place(buf, r.Key)
		m.Value, buf = place(buf, r.Value)
		if n := len(r.Headers); n > 0 {
			mh := hs[h : h+n : h+n]
			for j, rh := range r.Headers {
				mh[j].Key = rh.Key // a string: kgo's own copy
				mh[j].Value, buf = place(buf, rh.Value)
			}
			m.Headers = mh
			h += n
		}
		out[i] = m
	}
	return out
}

package kafka

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ringfence/ringfence/consumer"
)

// recordSlicer turns a slice of kgo records into engine messages: one
// allocation for the messages, one for their pointers, one for their
// headers. Null stays nil and empty stays empty, as in Source.
//
// A message shares the key, value and header values of its record when it
// may (share): kgo decodes an uncompressed batch in place, so those bytes
// live in the fetch response kgo read them into, which kgo never reuses;
// the message keeps the response alive, and nothing else writes to it
// (each slice is capped, so that appending to a message's bytes copies).
// What a compressed batch holds lives in a decompression buffer that kgo
// hands back to kgoPools once every record of the batch was recycled: those
// bytes, and every record's when it may not share, are copied into an arena
// for the slice (each over largeValue gets its own allocation), as Source
// does, and a message kept for long then pins only its slice's small
// neighbours. How many fetch responses shared messages may pin is bounded
// (see sharing).
type recordSlicer struct{}

// build returns the messages of recs, of partition p, sharing their bytes
// if share is set and their batch is uncompressed. It reports whether any
// message shares.
func (recordSlicer) build(p consumer.Partition, recs []*kgo.Record, share bool) ([]*consumer.Message, bool) {
	arena, nh, shared := 0, 0, false
	for _, r := range recs {
		nh += len(r.Headers)
		if share && r.Attrs.CompressionType() == 0 {
			shared = true
			continue
		}
		arena += small(r.Key) + small(r.Value)
		for _, h := range r.Headers {
			arena += small(h.Value)
		}
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
		own := share && r.Attrs.CompressionType() == 0
		if own {
			m.Key, m.Value = capped(r.Key), capped(r.Value)
		} else {
			m.Key, buf = place(buf, r.Key)
			m.Value, buf = place(buf, r.Value)
		}
		if n := len(r.Headers); n > 0 {
			mh := hs[h : h+n : h+n]
			for j, rh := range r.Headers {
				mh[j].Key = rh.Key // a string: kgo's own copy
				if own {
					mh[j].Value = capped(rh.Value)
				} else {
					mh[j].Value, buf = place(buf, rh.Value)
				}
			}
			m.Headers = mh
			h += n
		}
		out[i] = m
	}
	return out, shared
}

// capped is v with its capacity cut to its length: appending to it copies
// rather than writing over the bytes that follow it in the response.
func capped(v []byte) []byte { return v[:len(v):len(v)] }

// maxSharedFetches bounds the fetches whose responses messages that share
// their records' bytes may keep alive (see sharing).
const maxSharedFetches = 3

// sharing tracks the fetches whose responses shared messages keep alive, so
// that their number stays within maxSharedFetches: a fetch is released once
// every partition's commit point passed the last message it shared from it
// (the engine no longer holds any of them), or the partition was revoked.
// While maxSharedFetches fetches are held, the records of any other fetch are
// copied. A message the engine holds for long (a parked tenant's, a call
// that hangs) thus pins at most maxSharedFetches fetches' responses, whatever
// else flows meanwhile. Used under deliverMu.
type sharing struct {
	pinned []pinnedFetch
	// copied counts the slices copied because maxSharedFetches fetches were
	// held (tests read it).
	copied int
}

// pinnedFetch is a fetch some messages share the response of.
type pinnedFetch struct {
	seq   int64
	parts []pinnedPart
}

// pinnedPart is a partition that messages sharing a fetch's response are
// of, and the offset past the last of them.
type pinnedPart struct {
	ps  *groupPart
	end int64
}

// admit reports whether messages may share the response of fetch seq.
func (sh *sharing) admit(seq int64) bool {
	if seq < 0 {
		return false
	}
	for i := range sh.pinned {
		if sh.pinned[i].seq == seq {
			return true
		}
	}
	if len(sh.pinned) < maxSharedFetches {
		sh.pinned = append(sh.pinned, pinnedFetch{seq: seq})
		return true
	}
	sh.copied++
	return false
}

// note records that messages of ps up to end share fetch seq's response
// (admitted).
func (sh *sharing) note(seq int64, ps *groupPart, end int64) {
	for i := range sh.pinned {
		sp := &sh.pinned[i]
		if sp.seq != seq {
			continue
		}
		if n := len(sp.parts); n > 0 && sp.parts[n-1].ps == ps {
			sp.parts[n-1].end = end
			return
		}
		sp.parts = append(sp.parts, pinnedPart{ps: ps, end: end})
		return
	}
}

// release drops the fetches that no message the engine holds shares any
// more; parts is the table of assigned partitions.
func (sh *sharing) release(parts map[int32]*groupPart) {
	kept := sh.pinned[:0]
	for _, sp := range sh.pinned {
		live := sp.parts[:0]
		for _, pp := range sp.parts {
			if parts[pp.ps.id.ID] == pp.ps && pp.ps.want.Load() < pp.end {
				live = append(live, pp)
			}
		}
		clear(sp.parts[len(live):])
		sp.parts = live
		if len(live) > 0 {
			kept = append(kept, sp)
		}
	}
	clear(sh.pinned[len(kept):])
	sh.pinned = kept
}

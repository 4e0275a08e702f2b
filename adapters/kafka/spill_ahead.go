package kafka

import (
	"sync"

	"github.com/ringfence/ringfence/consumer"
)

// DefaultSpillReadAhead bounds the spill records a SpillLog keeps decoded
// between Reads, across lanes.
const DefaultSpillReadAhead = 8 << 20

// readAhead keeps what a Read fetched beyond its limit, per lane, so that
// the next Read from where that one stopped needs no fetch. The engine reads
// a lane in windows (RefeedWindow, and often a few entries at a time as its
// handler frees room), while one fetch returns whole record batches of up
// to 256 entries each (one Append). Entries at a position never change (a
// log is append-only), so what is kept is never wrong, only possibly
// unused: it is bounded in bytes across lanes, the least recently used
// lane's entries going first. Safe for concurrent use; mu is a leaf lock.
type readAhead struct {
	max int // bytes; 0 disables

	mu    sync.Mutex
	bytes int
	seq   uint64
	lanes map[consumer.SpillLane]*ahead
}

// ahead is what is kept for one lane: the entries at positions from on,
// in order (positions of other groups' records left out), up to next, the
// position a fetch must go on from once they are taken. An ahead with no
// entries says only that nothing of the lane lies in [from, next).
type ahead struct {
	from  int64
	next  int64
	msgs  []*consumer.Message
	sizes []int
	bytes int
	used  uint64
}

// aheadOverhead is what keeping anything for a lane costs, roughly.
const aheadOverhead = 128

// entrySize is what a kept message costs, roughly.
func entrySize(m *consumer.Message) int {
	n := 200 + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += 24 + len(h.Key) + len(h.Value)
	}
	return n
}

// take returns up to limit entries kept for lane at position from, or,
// when nothing of the lane lies between from and the position a fetch
// must go on from, none and that position. ok is false when nothing is
// kept at from (what is kept elsewhere is dropped: the reader moved).
func (r *readAhead) take(lane consumer.SpillLane, from int64, limit int) (msgs []*consumer.Message, resume int64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.lanes[lane]
	if a == nil {
		return nil, 0, false
	}
	if a.from != from {
		r.drop(lane, a)
		return nil, 0, false
	}
	if len(a.msgs) == 0 {
		r.drop(lane, a)
		return nil, a.next, true
	}
	n := min(limit, len(a.msgs))
	out := a.msgs[:n:n]
	freed := 0
	for _, s := range a.sizes[:n] {
		freed += s
	}
	if n == len(a.msgs) {
		r.drop(lane, a)
		return out, 0, true
	}
	a.msgs, a.sizes = a.msgs[n:], a.sizes[n:]
	a.bytes -= freed
	r.bytes -= freed
	a.from = out[n-1].SpillPos + 1
	r.seq++
	a.used = r.seq
	return out, 0, true
}

// put keeps msgs (in order, all past the entries just returned, all
// before next) for lane, to be read from position from; it keeps nothing
// when they alone pass the bound, and makes room by dropping the least
// recently used lanes.
func (r *readAhead) put(lane consumer.SpillLane, from int64, msgs []*consumer.Message, next int64) {
	if r.max <= 0 {
		return
	}
	sizes := make([]int, len(msgs))
	total := aheadOverhead
	for i, m := range msgs {
		sizes[i] = entrySize(m)
		total += sizes[i]
	}
	if total > r.max {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lanes == nil {
		r.lanes = make(map[consumer.SpillLane]*ahead)
	}
	if old := r.lanes[lane]; old != nil {
		r.drop(lane, old)
	}
	for r.bytes+total > r.max {
		var lru consumer.SpillLane
		var victim *ahead
		for l, a := range r.lanes {
			if victim == nil || a.used < victim.used {
				lru, victim = l, a
			}
		}
		r.drop(lru, victim)
	}
	r.seq++
	r.lanes[lane] = &ahead{from: from, next: next, msgs: msgs, sizes: sizes, bytes: total, used: r.seq}
	r.bytes += total
}

// forget drops what is kept for the lanes of partition p.
func (r *readAhead) forget(p consumer.Partition) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for l, a := range r.lanes {
		if l.Partition == p {
			r.drop(l, a)
		}
	}
}

// kept returns the bytes kept now.
func (r *readAhead) kept() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bytes
}

// drop forgets lane's entries. Called with r.mu held.
func (r *readAhead) drop(lane consumer.SpillLane, a *ahead) {
	r.bytes -= a.bytes
	delete(r.lanes, lane)
}

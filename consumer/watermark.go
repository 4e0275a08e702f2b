package consumer

// watermark tracks the delivered offsets of one partition and which of them
// are settled, so that the commit point is always the lowest unsettled
// offset. Offsets arrive in increasing order (with gaps allowed); settles
// arrive in any order. push and settle are amortised O(1): entries live in a
// slice indexed by delivery sequence, and the settled prefix is cut off as
// it grows.
//
// A watermark is not safe for concurrent use; partState.mu guards it.
type watermark struct {
	base    uint64  // delivery sequence of entries[head]
	head    int     // index of the first live entry
	offsets []int64 // offset of each delivered message, by sequence
	done    []bool  // settled flags, parallel to offsets
	next    int64   // offset after the last delivered message; -1 before any
	commit  int64   // last commit point reported; -1 before any
}

func newWatermark() watermark { return watermark{next: -1, commit: -1} }

// push records a delivered offset and returns its sequence.
func (w *watermark) push(offset int64) uint64 {
	seq := w.base + uint64(len(w.offsets)-w.head)
	w.offsets = append(w.offsets, offset)
	w.done = append(w.done, false)
	w.next = offset + 1
	return seq
}

// settle marks seq settled and returns the new commit point and whether it
// advanced. Settling an unknown or already settled sequence is a no-op.
func (w *watermark) settle(seq uint64) (int64, bool) {
	if seq < w.base {
		return w.commit, false
	}
	i := w.head + int(seq-w.base)
	if i >= len(w.done) || w.done[i] {
		return w.commit, false
	}
	w.done[i] = true
	if i != w.head {
		return w.commit, false
	}
	for w.head < len(w.done) && w.done[w.head] {
		w.head++
		w.base++
	}
	var point int64
	if w.head < len(w.offsets) {
		point = w.offsets[w.head]
	} else {
		point = w.next
	}
	// Compact once the dead prefix dominates, keeping the cost amortised.
	if w.head > 64 && w.head*2 >= len(w.offsets) {
		n := copy(w.offsets, w.offsets[w.head:])
		copy(w.done, w.done[w.head:])
		w.offsets = w.offsets[:n]
		w.done = w.done[:n]
		w.head = 0
	}
	if point <= w.commit {
		return w.commit, false
	}
	w.commit = point
	return point, true
}

// pending is how many delivered messages are not settled.
func (w *watermark) pending() int {
	n := 0
	for _, d := range w.done[w.head:] {
		if !d {
			n++
		}
	}
	return n
}

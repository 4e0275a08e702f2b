package consumer

import (
	"sync/atomic"
	"time"
)

// This file is time per tenant: a message's produce time on the engine
// clock (bornOf), the dwell histogram that settles feed (dwellHist,
// dwellRun), and when a tenant's breaker was first found open (openSince).
// Stats reads the ages from the lanes' head messages (see Stats).

// dwellBounds are the upper bounds of the dwell histogram's buckets; a
// last bucket counts the rest.
var dwellBounds = [...]time.Duration{
	5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second, 30 * time.Second,
	time.Minute, 5 * time.Minute, 15 * time.Minute, time.Hour,
}

// DwellBuckets returns the upper bounds of the dwell histograms' buckets
// (TenantStats.Dwell, Totals.Dwell), shortest first: a message's time from
// its produce time (Message.Time) to its settle.
func DwellBuckets() []time.Duration { return append([]time.Duration(nil), dwellBounds[:]...) }

// Histogram is a snapshot of a histogram of durations over DwellBuckets.
type Histogram struct {
	// Counts[i] is how many observations were at most DwellBuckets()[i]
	// (cumulative, as Prometheus buckets are).
	Counts []uint64
	// Count is how many observations there were in all; Sum their total.
	Count uint64
	Sum   time.Duration
}

// dwellHist counts one tenant's settles by dwell. Each bucket is counted
// apart (not cumulative): a settle adds to one bucket and to the sum. The
// sum comes first, beside the first buckets, where most settles go: a
// settle then writes one line of a tenant, not two, which with many
// tenants is one cache miss fewer (TestTenantLayout).
type dwellHist struct {
	sum atomic.Int64
	n   [len(dwellBounds) + 1]atomic.Uint64
}

// dwellBucket is the bucket of a dwell of d ns.
func dwellBucket(d int64) int {
	for i, b := range dwellBounds {
		if d <= int64(b) {
			return i
		}
	}
	return len(dwellBounds)
}

// addTo adds h's counts to into (non-cumulative, as h keeps them).
func (h *dwellHist) addTo(into *[len(dwellBounds) + 1]uint64, sum *int64) {
	for i := range h.n {
		into[i] += h.n[i].Load()
	}
	*sum += h.sum.Load()
}

// histogram makes the cumulative snapshot of counts n and sum.
func histogram(n *[len(dwellBounds) + 1]uint64, sum int64) Histogram {
	h := Histogram{Counts: make([]uint64, len(dwellBounds)), Sum: time.Duration(sum)}
	var acc uint64
	for i := range dwellBounds {
		acc += n[i]
		h.Counts[i] = acc
	}
	h.Count = acc + n[len(dwellBounds)]
	return h
}

// dwellRun gathers the dwells of the messages one finish settles, so that
// a run of a quick lane costs one add per bucket it touches and one for the
// sum, not two per message.
type dwellRun struct {
	b   int // bucket of n; meaningful while n > 0
	n   uint64
	sum int64
}

// add counts a settle of m at engine clock now into r, flushing r's bucket
// to h when m's differs.
func (r *dwellRun) add(c *Consumer, h *dwellHist, m *Message, now int64) {
	d := max(now-c.bornOf(m), 0)
	b := dwellBucket(d)
	if r.n > 0 && b != r.b {
		h.n[r.b].Add(r.n)
		r.n = 0
	}
	r.b = b
	r.n++
	r.sum += d
}

// flush adds what r gathered to h.
func (r *dwellRun) flush(h *dwellHist) {
	if r.n > 0 {
		h.n[r.b].Add(r.n)
		h.sum.Add(r.sum)
	}
	*r = dwellRun{}
}

// bornOf is m's produce time on the engine clock (ns since epoch): its
// Message.Time, or its receipt (delivery or re-feed) when it has none. The
// engine clock and Message.Time are both wall times, so they compare; a
// produce time ahead of the engine's (clock skew) gives ages of zero.
func (c *Consumer) bornOf(m *Message) int64 {
	if m.Time.IsZero() {
		return m.st.at
	}
	ns := m.Time.UnixNano()
	if ns <= 0 {
		return m.st.at
	}
	return ns - c.epochNano
}

// stuckSince is when m's StuckAfter clock started, on the engine clock.
// While its tenant is in trouble (its lane parked, its breaker found open,
// or its DLQ refusing a dead letter) that is its first delivery to the
// group, not to this process: its produce time (Message.Time, which a
// re-fed spill record keeps) when earlier than its receipt, so that a head
// that held its partition's commit before a restart or a rebalance does
// not hold it for another full StuckAfter at its new owner. Otherwise, and
// for a message with no time or a producer clock ahead of ours, it is its
// receipt: a healthy tenant's head in a backlog is old, not stuck.
// Housekeeping reads it, with m's shard mu held; the delivery path does
// not.
func (c *Consumer) stuckSince(m *Message) int64 {
	if l := m.st.lane; l == nil || !(l.parked || l.t.openSince.Load() != 0 || l.t.dlqDownAt.Load() != 0) {
		return m.st.at
	}
	return min(m.st.at, c.bornOf(m))
}

// age is now minus born, at least zero.
func age(now, born int64) time.Duration { return time.Duration(max(now-born, 0)) }

// sinceEpoch reads the wall clock as an engine clock value.
func (c *Consumer) sinceEpoch() int64 {
	if c.wall != nil {
		return int64(c.wall().Sub(c.epoch))
	}
	return int64(time.Since(c.epoch))
}

// noteOpen records when the engine found t's breaker not closed, if it had
// not since the breaker last closed (see clearOpen). Stores max(now, 1):
// zero means none.
func (t *tenant) noteOpen(now int64) {
	t.openSince.CompareAndSwap(0, max(now, 1))
}

// clearOpen forgets t's open time once its breaker is closed again. The
// load alone runs while none is set: one read of a line finish writes
// anyway.
func (t *tenant) clearOpen() {
	if t.openSince.Load() != 0 {
		if g := t.peekGuard(); g != nil && g.Closed() {
			t.openSince.Store(0)
		}
	}
}

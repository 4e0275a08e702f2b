package consumer_test

import (
	"fmt"
	"strconv"

	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
)

// checkRound checks the invariants of a finished round.
func checkRound(h *consumertest.MemHarness, rp *roundPlan, w *roundWorld, ends []int64) (problems []string) {
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	describe := func(id int) string {
		m := rp.msgs[id]
		name := "-"
		if m.tenant >= 0 {
			name = tenantName(m.tenant)
		}
		return fmt.Sprintf("#%d(%s p%d %s)", id, name, m.part, m.kind)
	}

	// Dead letters, by id, with the bucket they were found in.
	type letter struct {
		bucket string
		rec    dlq.Record
	}
	letters := map[int][]letter{}
	collect := func(bucket string, recs []dlq.Record) {
		for _, r := range recs {
			id, err := strconv.Atoi(string(r.Value))
			if err != nil || id < 0 || id >= len(rp.msgs) {
				fail("dead letter with unknown value %q in %s", r.Value, bucket)
				continue
			}
			letters[id] = append(letters[id], letter{bucket, r})
		}
	}
	total := 0
	for ti := range rp.tenants {
		recs := h.S.Records(tenantName(ti), false)
		total += len(recs)
		collect(tenantName(ti), recs)
	}
	noTenant := h.S.Records("", true)
	total += len(noTenant)
	collect("no-tenant", noTenant)
	w.letters = total
	if total != h.S.Total() {
		fail("the DLQ holds %d records, %d of them in known buckets", h.S.Total(), total)
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	for id, m := range rp.msgs {
		ls := letters[id]
		// 1. Nothing lost.
		if w.count[id] == 0 && len(ls) == 0 {
			fail("lost: %s neither handled nor dead-lettered (calls %d)", describe(id), w.calls[id].Load())
		}
		// 2. Dead letters only for messages that can never succeed, in their
		// own tenant's bucket.
		if m.kind.mustDeadLetter() && len(ls) == 0 {
			fail("%s never reached its DLQ", describe(id))
		}
		if !m.kind.mustDeadLetter() && len(ls) > 0 {
			fail("dead-lettered a message that can succeed: %s reason %q error %q attempts %d (calls %d, handled %d)",
				describe(id), ls[0].rec.Reason, ls[0].rec.Error, ls[0].rec.Attempts, w.calls[id].Load(), w.count[id])
		}
		want := "no-tenant"
		if m.tenant >= 0 {
			want = tenantName(m.tenant)
		}
		for _, l := range ls {
			if l.bucket != want {
				fail("%s dead-lettered into %s's DLQ", describe(id), l.bucket)
			}
			var okReason bool
			switch m.kind {
			case kindPermanent:
				okReason = l.rec.Reason == dlq.ReasonPermanent
			case kindPoison:
				okReason = l.rec.Reason == dlq.ReasonPoison || l.rec.Reason == dlq.ReasonExhausted
			case kindNoTenant:
				okReason = l.rec.Reason == dlq.ReasonNoTenant
			case kindInvalidTenant:
				okReason = l.rec.Reason == dlq.ReasonInvalidTenant
			default:
				okReason = true // reported above
			}
			if !okReason {
				fail("%s dead-lettered with reason %q", describe(id), l.rec.Reason)
			}
		}
		// Without a rebalance or restart nothing is delivered twice.
		if !rp.redelivers && (w.count[id] > 1 || len(ls) > 1) {
			fail("%s handled %d times and dead-lettered %d times with no redelivery", describe(id), w.count[id], len(ls))
		}
	}

	// 3. Per-lane order of first handlings. The one documented reordering:
	// a message handled as evidence against its lane's suspect head runs
	// ahead of the head and of the messages tried before it, and is
	// reported as EventReordered.
	reordered := map[int]bool{}
	for po := range w.reordered {
		if p, off := po[0], po[1]; int(p) < len(w.offsets) && off < int64(len(w.offsets[p])) {
			reordered[w.offsets[p][off]] = true
		} else {
			fail("EventReordered for unknown partition %d offset %d", p, off)
		}
	}
	type lk struct{ t, p int }
	lanes := map[lk][]int{}
	for pos, id := range w.handled {
		if w.firstAt[id] != int64(pos) {
			continue
		}
		m := rp.msgs[id]
		lanes[lk{m.tenant, m.part}] = append(lanes[lk{m.tenant, m.part}], id)
	}
	for _, seq := range lanes {
		// ids are produced in offset order within a lane, so id order is
		// offset order.
		maxBefore := -1
		for i, id := range seq {
			if id > maxBefore {
				maxBefore = id
				continue
			}
			var ahead []string
			for _, prev := range seq[:i] {
				if prev > id && !reordered[prev] {
					ahead = append(ahead, describe(prev))
				}
			}
			if len(ahead) > 0 {
				fail("order: %s first handled after %v, not reported as reordered (lane sequence %v)", describe(id), ahead, laneWindow(seq, i))
			}
		}
	}

	// 4. Commits: no regression, every partition at its log end.
	if r := h.B.Regressions(); len(r) != 0 {
		fail("commit regressions: %v", r)
	}
	for p, end := range ends {
		if got := h.B.Committed(h.Group, p); got != end {
			fail("partition %d committed %d, log end %d", p, got, end)
		}
	}
	return problems
}

// laneWindow shows seq around i.
func laneWindow(seq []int, i int) []int {
	return seq[max(0, i-4):min(len(seq), i+3)]
}

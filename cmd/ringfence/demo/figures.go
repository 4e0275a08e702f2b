package demo

import (
	"math"
	"slices"
	"time"
)

// never marks a time that did not happen (a message never produced,
// handled or dead-lettered) and a latency that has no end.
const never = time.Duration(math.MaxInt64)

// timeline is what one run recorded, by message id and by sample: the
// input of every figure. Times are from the run's start.
type timeline struct {
	mode   Mode
	owner  []int32 // tenant index, by id
	kinds  []byte  // by id
	bad    int     // tenant index
	poison int     // tenant index; -1 for none
	// healthy and mates mark tenants: healthy ones (neither bad nor
	// poison), and the healthy ones sharing the bad tenant's partition.
	healthy, mates []bool
	// faultStart and faultEnd bound the fault window.
	faultStart, faultEnd time.Duration

	// produced is when the message was produced (its stamp); never if not.
	produced []time.Duration
	// handled is when the message was first handled by the run's consumer
	// (before the drain ended); never if not.
	handled []time.Duration
	// latency is handled minus the produce stamp carried in the message.
	latency []time.Duration
	// fromBroker is handled minus the message's broker timestamp (NATS:
	// when the server stored it; Kafka: the record's timestamp, which the
	// producer's client sets as it encodes the batch): the part of latency
	// that is the consumer's.
	fromBroker []time.Duration
	// order is the rank of the message's first handling (1, 2, ...); 0 if
	// never handled.
	order []uint64
	// dead is when the sink durably wrote the message's dead letter; never
	// if it did not.
	dead []time.Duration
	// inDLQ marks the messages read back from the DLQs after the run.
	inDLQ []bool
	// recovered marks messages the restart read-back handled: left
	// unfinished by the run, but still in the broker.
	recovered []bool
	// reordered marks messages the engine reported with EventReordered
	// (handled ahead of a suspect head).
	reordered []bool

	// deadline is the end of production plus Scenario.Settle; drainEnd is
	// when the run stopped consuming.
	deadline, drainEnd time.Duration
	// lag is the commit lag sampled through the run.
	lag []lagSample
	// heapBefore is the live heap just before the consumer started; heap
	// is the live heap sampled through the run.
	heapBefore uint64
	heap       []heapSample
	// badParks counts EventParked of the bad tenant.
	badParks int
}

// lagSample is the commit lag of each partition at one time: Kafka, the
// log end offset minus the group's committed offset; NATS, the consumer's
// NumPending + NumAckPending.
type lagSample struct {
	at    time.Duration
	parts []int64
}

// heapSample is the live heap (bytes marked live by the last GC) at one
// time.
type heapSample struct {
	at   time.Duration
	live uint64
}

// figures are one run's numbers, computed from its timeline.
type figures struct {
	Produced int
	// Goodput during the fault window: messages first handled within it,
	// of the healthy tenants and of the bad tenant's partition-mates.
	HealthyGoodput, MatesGoodput int
	// P99 end-to-end latency (produce stamp to first handled) of the
	// messages produced during the fault window; never when the 99th
	// percentile message was not handled by the end of the drain. N counts
	// the messages.
	HealthyP99, MatesP99 time.Duration
	HealthyN, MatesN     int
	// MatesFromBrokerP99 is the mates' p99 from the broker's timestamp to
	// first handled, same messages: on NATS it leaves out the time the
	// server took to store a message, which a hot tenant's traffic on the
	// same broker lengthens for everyone (see timeline.fromBroker).
	MatesFromBrokerP99 time.Duration
	// MaxLagFault is the largest commit lag of one partition sampled during
	// the fault window; MaxLagRun through the whole run and drain.
	MaxLagFault, MaxLagRun int64
	LagSamples             int
	// HeapPeak is the largest live heap sampled; ConsumerHeap that minus
	// the live heap before the consumer started.
	HeapPeak, ConsumerHeap uint64
	// BadParked counts EventParked of the bad tenant.
	BadParked int
	// Dead letters read back, by group.
	BadDead, PoisonDead, OtherDead int
	// GoodDead counts dead letters read back of messages that are not
	// poison, any tenant's.
	GoodDead int
	// The bad tenant's poison burst (poison-burst, dlq-outage): its poison
	// messages produced, how many of them were read back from the DLQ, and
	// when the last of them was written to it (never when one was not
	// written by the end of the drain).
	BurstPoison, BurstDead int
	BurstLastDead          time.Duration
	// BurstFirstAfter is when the first of them was written at or after
	// the end of the fault window (never when none was): after a DLQ
	// outage, how soon dead-lettering resumed.
	BurstFirstAfter time.Duration
	// BadAfterP99 is the p99 end-to-end latency of the bad tenant's
	// messages produced after the fault window (never when the 99th
	// percentile message was not handled); BadAfterN counts them.
	BadAfterP99 time.Duration
	BadAfterN   int
	// BadInOrder counts the bad tenant's messages checked for order (first
	// handlings in handling order, less those EventReordered named);
	// BadOutOfOrder how many came after a later message of the tenant.
	BadInOrder, BadOutOfOrder int
	// Accounting: neither handled nor dead-lettered at the deadline; still
	// so at the end of the drain; of those, handled by the restart
	// read-back; and lost: produced, yet neither handled, nor in a DLQ, nor
	// found by the restart.
	UnfinishedAtDeadline, UnfinishedAfterDrain, Recovered, Lost int
}

// compute derives every figure of tl.
func (tl *timeline) compute() figures {
	f := figures{BurstFirstAfter: never}
	var healthyLat, matesLat, matesFromBrk, badAfter []time.Duration
	for id := range tl.owner {
		if tl.produced[id] == never {
			continue
		}
		f.Produced++
		t := tl.owner[id]
		poison := tl.kinds[id] == kindPoison
		if int(t) == tl.bad {
			switch {
			case poison:
				f.BurstPoison++
				if tl.inDLQ[id] {
					f.BurstDead++
				}
				f.BurstLastDead = max(f.BurstLastDead, tl.dead[id])
				if tl.dead[id] >= tl.faultEnd {
					f.BurstFirstAfter = min(f.BurstFirstAfter, tl.dead[id])
				}
			case tl.produced[id] >= tl.faultEnd:
				lat := tl.latency[id]
				if tl.handled[id] == never {
					lat = never
				}
				badAfter = append(badAfter, lat)
			}
		}
		if tl.inDLQ[id] && !poison {
			f.GoodDead++
		}
		if tl.healthy[t] {
			if h := tl.handled[id]; h >= tl.faultStart && h < tl.faultEnd {
				f.HealthyGoodput++
				if tl.mates[t] {
					f.MatesGoodput++
				}
			}
			if pr := tl.produced[id]; pr >= tl.faultStart && pr < tl.faultEnd {
				lat := tl.latency[id]
				if tl.handled[id] == never {
					lat = never
				}
				healthyLat = append(healthyLat, lat)
				if tl.mates[t] {
					matesLat = append(matesLat, lat)
					fb := lat // never stays never
					if lat != never {
						fb = tl.fromBroker[id]
					}
					matesFromBrk = append(matesFromBrk, fb)
				}
			}
		}
		if tl.inDLQ[id] {
			switch int(t) {
			case tl.bad:
				f.BadDead++
			case tl.poison:
				f.PoisonDead++
			default:
				f.OtherDead++
			}
		}
		if !doneBy(tl.handled[id], tl.dead[id], tl.deadline) {
			f.UnfinishedAtDeadline++
		}
		if !doneBy(tl.handled[id], tl.dead[id], tl.drainEnd) {
			f.UnfinishedAfterDrain++
		}
		if tl.handled[id] == never && !tl.inDLQ[id] {
			if tl.recovered[id] {
				f.Recovered++
			} else {
				f.Lost++
			}
		}
	}
	f.HealthyN, f.MatesN = len(healthyLat), len(matesLat)
	f.HealthyP99, f.MatesP99 = p99(healthyLat), p99(matesLat)
	f.MatesFromBrokerP99 = p99(matesFromBrk)
	f.BadAfterN, f.BadAfterP99 = len(badAfter), p99(badAfter)
	f.MaxLagFault, _ = maxLag(tl.lag, tl.faultStart, tl.faultEnd)
	f.MaxLagRun, f.LagSamples = maxLag(tl.lag, 0, never)
	for _, s := range tl.heap {
		f.HeapPeak = max(f.HeapPeak, s.live)
	}
	if f.HeapPeak > tl.heapBefore {
		f.ConsumerHeap = f.HeapPeak - tl.heapBefore
	}
	f.BadParked = tl.badParks
	f.BadInOrder, f.BadOutOfOrder = tl.badOrder()
	return f
}

// doneBy reports whether a message handled at h or dead-lettered at d was
// done by t.
func doneBy(h, d, t time.Duration) bool { return h <= t || d <= t }

// p99 is the nearest-rank 99th percentile of lat (0 when empty); a latency
// of never sorts last.
func p99(lat []time.Duration) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	rank := int(math.Ceil(0.99 * float64(len(s))))
	return s[max(rank, 1)-1]
}

// maxLag is the largest lag of one partition among the samples taken in
// [from, to], and how many samples that was.
func maxLag(samples []lagSample, from, to time.Duration) (int64, int) {
	var m int64
	n := 0
	for _, s := range samples {
		if s.at < from || s.at > to {
			continue
		}
		n++
		for _, l := range s.parts {
			m = max(m, l)
		}
	}
	return m, n
}

// badOrder checks the bad tenant's first handlings, in handling order, for
// produce order (ids of one tenant are in produce order: it is one key on
// one partition). Messages the engine reported as reordered (handled ahead
// of a suspect head, its one documented reordering) are left out. It
// returns how many messages were checked and how many of them came after a
// later message.
func (tl *timeline) badOrder() (checked, outOfOrder int) {
	type handling struct {
		rank uint64
		id   int
	}
	var hs []handling
	for id, t := range tl.owner {
		if int(t) == tl.bad && tl.order[id] != 0 && !tl.reordered[id] {
			hs = append(hs, handling{tl.order[id], id})
		}
	}
	slices.SortFunc(hs, func(a, b handling) int {
		switch {
		case a.rank < b.rank:
			return -1
		case a.rank > b.rank:
			return 1
		}
		return 0
	})
	top := -1
	for _, h := range hs {
		if h.id < top {
			outOfOrder++
		}
		top = max(top, h.id)
	}
	return len(hs), outOfOrder
}

// tenantCounts are one tenant's numbers in one run.
type tenantCounts struct {
	Handled, InWindow, DeadLettered int
}

// perTenant counts, by tenant: messages handled by the run, handled during
// the fault window, and read back from the DLQ.
func (tl *timeline) perTenant(tenants int) []tenantCounts {
	out := make([]tenantCounts, tenants)
	for id, t := range tl.owner {
		c := &out[t]
		if h := tl.handled[id]; h != never {
			c.Handled++
			if h >= tl.faultStart && h < tl.faultEnd {
				c.InWindow++
			}
		}
		if tl.inDLQ[id] {
			c.DeadLettered++
		}
	}
	return out
}

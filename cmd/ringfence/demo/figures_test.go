package demo

import (
	"testing"
	"time"
)

const ms = time.Millisecond

// msg is one message of a synthetic timeline. Zero times mean never.
type msg struct {
	t                  int32 // tenant: 0 bad, 1 poison, 2 and 3 healthy mates, 4 healthy elsewhere
	produced, handled  time.Duration
	dead               time.Duration
	lat                time.Duration
	fromBrk            time.Duration // handled minus the broker's timestamp; zero: lat
	order              uint64
	inDLQ, recovered   bool
	reordered, neverPr bool
	poison             bool // kindPoison (else kindOK)
}

// synth builds a timeline of five tenants: 0 bad, 1 poison, 2-3 healthy
// partition-mates of the bad tenant, 4 healthy on another partition; the
// fault window is [1s, 2s), the deadline 5s, the drain ends at 8s.
func synth(msgs ...msg) *timeline {
	n := len(msgs)
	tl := &timeline{
		bad: 0, poison: 1,
		healthy:    []bool{false, false, true, true, true},
		mates:      []bool{false, false, true, true, false},
		faultStart: time.Second, faultEnd: 2 * time.Second,
		deadline: 5 * time.Second, drainEnd: 8 * time.Second,
		owner: make([]int32, n), kinds: make([]byte, n),
		produced: make([]time.Duration, n), handled: make([]time.Duration, n), latency: make([]time.Duration, n),
		fromBroker: make([]time.Duration, n),
		order:      make([]uint64, n), dead: make([]time.Duration, n),
		inDLQ: make([]bool, n), recovered: make([]bool, n), reordered: make([]bool, n),
	}
	or := func(d time.Duration) time.Duration {
		if d == 0 {
			return never
		}
		return d
	}
	for i, m := range msgs {
		tl.owner[i], tl.kinds[i] = m.t, kindOK
		if m.poison {
			tl.kinds[i] = kindPoison
		}
		tl.produced[i] = m.produced
		if m.neverPr {
			tl.produced[i] = never
		}
		tl.handled[i], tl.dead[i] = or(m.handled), or(m.dead)
		tl.latency[i], tl.order[i] = m.lat, m.order
		tl.fromBroker[i] = m.lat
		if m.fromBrk != 0 {
			tl.fromBroker[i] = m.fromBrk
		}
		tl.inDLQ[i], tl.recovered[i], tl.reordered[i] = m.inDLQ, m.recovered, m.reordered
	}
	return tl
}

func TestFiguresGoodput(t *testing.T) {
	t.Parallel()
	f := synth(
		msg{t: 2, produced: 900 * ms, handled: 999 * ms},         // before the window
		msg{t: 2, produced: 950 * ms, handled: time.Second},      // first instant of the window
		msg{t: 3, produced: 1500 * ms, handled: 1999 * ms},       // in
		msg{t: 4, produced: 1500 * ms, handled: 1600 * ms},       // in, not a mate
		msg{t: 4, produced: 1900 * ms, handled: 2 * time.Second}, // window is half-open
		msg{t: 0, produced: 1100 * ms, handled: 1200 * ms},       // the bad tenant does not count
		msg{t: 1, produced: 1100 * ms, handled: 1200 * ms},       // nor the poison tenant
		msg{t: 3, produced: 1200 * ms},                           // never handled
		msg{t: 3, neverPr: true},                                 // never produced (run cut short)
	).compute()
	if f.HealthyGoodput != 3 || f.MatesGoodput != 2 || f.Produced != 8 {
		t.Fatalf("goodput healthy %d (want 3), mates %d (want 2), produced %d (want 8)", f.HealthyGoodput, f.MatesGoodput, f.Produced)
	}
}

func TestP99(t *testing.T) {
	t.Parallel()
	lat := func(n int, last ...time.Duration) []time.Duration {
		var out []time.Duration
		for i := range n {
			out = append(out, time.Duration(i+1)*ms)
		}
		return append(out, last...)
	}
	for _, tc := range []struct {
		name string
		in   []time.Duration
		want time.Duration
	}{
		{"empty", nil, 0},
		{"one", []time.Duration{7 * ms}, 7 * ms},
		{"100: the 99th", lat(100), 99 * ms},
		{"200: the 198th", lat(200), 198 * ms},
		{"101: the 100th", lat(101), 100 * ms},
		{"unsorted", []time.Duration{5 * ms, 1 * ms, 3 * ms}, 5 * ms},
		{"one never in 100: not the p99", lat(99, never), 99 * ms},
		{"two never in 100: the p99 never ended", lat(98, never, never), never},
	} {
		if got := p99(tc.in); got != tc.want {
			t.Errorf("%s: p99 = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestFiguresLatency(t *testing.T) {
	t.Parallel()
	var msgs []msg
	// 100 mate messages produced in the window, 1..100ms; the p99 is 99ms.
	for i := range 100 {
		msgs = append(msgs, msg{t: 2, produced: 1100 * ms, handled: 1200 * ms, lat: time.Duration(i+1) * ms})
	}
	// A healthy non-mate produced before the window with a huge latency:
	// outside the window, it does not count.
	msgs = append(msgs, msg{t: 4, produced: 900 * ms, handled: 4 * time.Second, lat: 3 * time.Second})
	// 50 non-mates in the window, two never handled: with the mates that is
	// 150 messages, the p99 is the 149th: never.
	for i := range 50 {
		m := msg{t: 4, produced: 1500 * ms, handled: 1600 * ms, lat: ms}
		if i < 2 {
			m.handled = 0
		}
		msgs = append(msgs, m)
	}
	f := synth(msgs...).compute()
	if f.MatesP99 != 99*ms || f.MatesN != 100 {
		t.Errorf("mates p99 %v over %d, want 99ms over 100", f.MatesP99, f.MatesN)
	}
	if f.HealthyP99 != never || f.HealthyN != 150 {
		t.Errorf("healthy p99 %v over %d, want never over 150", f.HealthyP99, f.HealthyN)
	}
}

// TestFiguresFromBroker checks the mates' p99 from the broker's timestamp:
// the same messages as their end-to-end p99, each less the time the broker
// took to store it, and never for one never handled.
func TestFiguresFromBroker(t *testing.T) {
	t.Parallel()
	var msgs []msg
	for i := range 100 {
		lat := time.Duration(i+1) * ms
		// The broker took 5ms to store each, except the slowest ten, which
		// waited 50ms to be stored: their consumer part is under 50ms.
		stored := 5 * ms
		if i >= 90 {
			stored = 50 * ms
		}
		msgs = append(msgs, msg{t: 3, produced: 1100 * ms, handled: 1200 * ms, lat: lat + stored, fromBrk: lat})
	}
	// A non-mate does not count.
	msgs = append(msgs, msg{t: 4, produced: 1100 * ms, handled: 1200 * ms, lat: time.Second, fromBrk: time.Second})
	f := synth(msgs...).compute()
	if f.MatesP99 != 149*ms || f.MatesFromBrokerP99 != 99*ms {
		t.Errorf("mates p99 %v end to end, %v from the broker; want 149ms and 99ms", f.MatesP99, f.MatesFromBrokerP99)
	}
	// Two mates never handled: the p99 from the broker never ended either.
	msgs = append(msgs, msg{t: 2, produced: 1500 * ms, lat: never}, msg{t: 2, produced: 1500 * ms, lat: never})
	if f := synth(msgs...).compute(); f.MatesFromBrokerP99 != never {
		t.Errorf("mates p99 from the broker %v with 2 of 102 never handled, want never", f.MatesFromBrokerP99)
	}
}

func TestMaxLag(t *testing.T) {
	t.Parallel()
	samples := []lagSample{
		{at: 500 * ms, parts: []int64{3, 900}},
		{at: time.Second, parts: []int64{10, 20}},
		{at: 1500 * ms, parts: []int64{40, 7}},
		{at: 2 * time.Second, parts: []int64{1, 55}},
		{at: 2500 * ms, parts: []int64{1000}},
	}
	for _, tc := range []struct {
		from, to time.Duration
		want     int64
		n        int
	}{
		{time.Second, 2 * time.Second, 55, 3},
		{0, never, 1000, 5},
		{1200 * ms, 1600 * ms, 40, 1},
		{3 * time.Second, never, 0, 0},
	} {
		if got, n := maxLag(samples, tc.from, tc.to); got != tc.want || n != tc.n {
			t.Errorf("maxLag [%v, %v] = %d over %d samples, want %d over %d", tc.from, tc.to, got, n, tc.want, tc.n)
		}
	}
	tl := synth()
	tl.lag = samples
	if f := tl.compute(); f.MaxLagFault != 55 || f.MaxLagRun != 1000 || f.LagSamples != 5 {
		t.Errorf("lag figures %d during the fault, %d in the run, %d samples", f.MaxLagFault, f.MaxLagRun, f.LagSamples)
	}
}

// TestFiguresAccounting: unfinished at the deadline, after the drain, found
// by the restart, and lost are told apart; the table never claims a loss
// that did not happen.
func TestFiguresAccounting(t *testing.T) {
	t.Parallel()
	s := time.Second
	for _, tc := range []struct {
		name                              string
		m                                 msg
		atDeadline, afterDrain, rec, lost int
		badDead                           int
	}{
		{"handled in time", msg{t: 2, produced: s, handled: 2 * s}, 0, 0, 0, 0, 0},
		{"handled in the drain", msg{t: 2, produced: s, handled: 6 * s}, 1, 0, 0, 0, 0},
		{"handled while stopping, after the drain", msg{t: 2, produced: s, handled: 9 * s}, 1, 1, 0, 0, 0},
		{"dead-lettered in time", msg{t: 0, produced: s, dead: 3 * s, inDLQ: true}, 0, 0, 0, 0, 1},
		{"dead-lettered in the drain", msg{t: 0, produced: s, dead: 7 * s, inDLQ: true}, 1, 0, 0, 0, 1},
		{"still in the broker: a restart found it", msg{t: 0, produced: s, recovered: true}, 1, 1, 1, 0, 0},
		{"gone", msg{t: 0, produced: s}, 1, 1, 0, 1, 0},
		{"the sink said written, the DLQ does not have it", msg{t: 0, produced: s, dead: 3 * s}, 0, 0, 0, 1, 0},
		{"never produced: not counted", msg{t: 2, neverPr: true}, 0, 0, 0, 0, 0},
	} {
		f := synth(tc.m).compute()
		if f.UnfinishedAtDeadline != tc.atDeadline || f.UnfinishedAfterDrain != tc.afterDrain || f.Recovered != tc.rec || f.Lost != tc.lost || f.BadDead != tc.badDead {
			t.Errorf("%s: unfinished %d at deadline, %d after drain, %d found by restart, %d lost, %d bad dead-lettered; want %d %d %d %d %d",
				tc.name, f.UnfinishedAtDeadline, f.UnfinishedAfterDrain, f.Recovered, f.Lost, f.BadDead, tc.atDeadline, tc.afterDrain, tc.rec, tc.lost, tc.badDead)
		}
	}
	// The dead letters are split by tenant.
	f := synth(msg{t: 0, produced: ms, inDLQ: true}, msg{t: 1, produced: ms, inDLQ: true}, msg{t: 1, produced: ms, inDLQ: true}, msg{t: 4, produced: ms, inDLQ: true}).compute()
	if f.BadDead != 1 || f.PoisonDead != 2 || f.OtherDead != 1 || f.Lost != 0 {
		t.Errorf("dead letters bad %d, poison %d, other %d, lost %d", f.BadDead, f.PoisonDead, f.OtherDead, f.Lost)
	}
}

// TestFiguresBurst: the bad tenant's poison burst is timed by its last
// dead letter, which must also be in the DLQ; its good messages after the
// window give their own p99; a good message in the DLQ is counted
// whoever's it is.
func TestFiguresBurst(t *testing.T) {
	t.Parallel()
	s := time.Second
	poison := func(dead time.Duration, inDLQ bool) msg {
		return msg{t: 0, produced: 1500 * ms, dead: dead, inDLQ: inDLQ, poison: true}
	}
	for _, tc := range []struct {
		name          string
		msgs          []msg
		poisonN, dead int
		first, last   time.Duration // first at or after the window's end (2s)
		goodDead      int
	}{
		{"all written", []msg{poison(2*s, true), poison(3*s, true), poison(2500*ms, true)}, 3, 3, 2 * s, 3 * s, 0},
		{"some in the window", []msg{poison(1800*ms, true), poison(2100*ms, true)}, 2, 2, 2100 * ms, 2100 * ms, 0},
		{"all in the window", []msg{poison(1800*ms, true), poison(1900*ms, true)}, 2, 2, never, 1900 * ms, 0},
		{"one never written", []msg{poison(2*s, true), poison(0, false)}, 2, 1, 2 * s, never, 0},
		{"written, then not read back", []msg{poison(2*s, true), poison(2*s, false)}, 2, 1, 2 * s, 2 * s, 0},
		{"a good message of the bad tenant dead-lettered", []msg{poison(2*s, true), {t: 0, produced: 1500 * ms, dead: 2 * s, inDLQ: true}}, 1, 1, 2 * s, 2 * s, 1},
		{"a healthy tenant's dead letter", []msg{{t: 4, produced: s, dead: 2 * s, inDLQ: true}}, 0, 0, never, 0, 1},
		{"the poison tenant's poison is not good", []msg{{t: 1, produced: s, dead: 2 * s, inDLQ: true, poison: true}}, 0, 0, never, 0, 0},
	} {
		f := synth(tc.msgs...).compute()
		if f.BurstPoison != tc.poisonN || f.BurstDead != tc.dead || f.BurstFirstAfter != tc.first || f.BurstLastDead != tc.last || f.GoodDead != tc.goodDead {
			t.Errorf("%s: burst %d, dead %d, first %v, last %v, good dead %d; want %d %d %v %v %d", tc.name,
				f.BurstPoison, f.BurstDead, f.BurstFirstAfter, f.BurstLastDead, f.GoodDead, tc.poisonN, tc.dead, tc.first, tc.last, tc.goodDead)
		}
	}
	// After the window (it ends at 2s): the bad tenant's good messages
	// only; one never handled has a latency of never.
	var msgs []msg
	for i := range 100 {
		msgs = append(msgs, msg{t: 0, produced: 2*s + time.Duration(i)*ms, handled: 3 * s, lat: time.Duration(i+1) * ms})
	}
	msgs = append(msgs, msg{t: 0, produced: 1500 * ms, handled: 3 * s, lat: time.Hour}, msg{t: 2, produced: 2 * s, handled: 3 * s, lat: time.Hour})
	f := synth(msgs...).compute()
	if f.BadAfterN != 100 || f.BadAfterP99 != 99*ms {
		t.Errorf("after the window: %d messages, p99 %v; want 100, 99ms", f.BadAfterN, f.BadAfterP99)
	}
	msgs[0].handled, msgs[1].handled = 0, 0 // two in a hundred: the 99th percentile
	if f := synth(msgs...).compute(); f.BadAfterP99 != never {
		t.Errorf("two never handled: p99 %v, want never", f.BadAfterP99)
	}
}

func TestBadOrder(t *testing.T) {
	t.Parallel()
	// The bad tenant's messages are ids 0..; order is the handling rank.
	bad := func(rank uint64, reordered bool) msg {
		return msg{t: 0, produced: ms, handled: 2 * ms, order: rank, reordered: reordered}
	}
	for _, tc := range []struct {
		name             string
		msgs             []msg
		checked, outOfOr int
	}{
		{"in order", []msg{bad(1, false), bad(2, false), bad(5, false)}, 3, 0},
		{"one late", []msg{bad(1, false), bad(3, false), bad(2, false)}, 3, 1},
		{"the head after two behind it", []msg{bad(3, false), bad(1, false), bad(2, false)}, 3, 1},
		// Judging: id 2 ran ahead of the suspect head (id 1) and was
		// reported as reordered: left out, the rest is in order.
		{"reordered left out", []msg{bad(1, false), bad(3, false), bad(2, true), bad(4, false)}, 3, 0},
		{"unhandled left out", []msg{bad(1, false), {t: 0, produced: ms}, bad(2, false)}, 2, 0},
		{"other tenants ignored", []msg{bad(2, false), {t: 2, produced: ms, handled: ms, order: 1}, bad(3, false)}, 2, 0},
	} {
		if c, o := synth(tc.msgs...).badOrder(); c != tc.checked || o != tc.outOfOr {
			t.Errorf("%s: %d checked, %d out of order; want %d, %d", tc.name, c, o, tc.checked, tc.outOfOr)
		}
	}
}

func TestFiguresHeap(t *testing.T) {
	t.Parallel()
	tl := synth()
	tl.heapBefore = 10 << 20
	tl.heap = []heapSample{{ms, 11 << 20}, {2 * ms, 25 << 20}, {3 * ms, 12 << 20}}
	if f := tl.compute(); f.HeapPeak != 25<<20 || f.ConsumerHeap != 15<<20 {
		t.Errorf("heap peak %d, consumer %d", f.HeapPeak, f.ConsumerHeap)
	}
	tl.heap = []heapSample{{ms, 9 << 20}} // shrank below the start: no growth
	if f := tl.compute(); f.ConsumerHeap != 0 {
		t.Errorf("consumer heap %d, want 0", f.ConsumerHeap)
	}
}

func TestFiguresPerTenant(t *testing.T) {
	t.Parallel()
	c := synth(
		msg{t: 2, produced: ms, handled: 1500 * ms},
		msg{t: 2, produced: ms, handled: 500 * ms},
		msg{t: 0, produced: ms, inDLQ: true},
	).perTenant(5)
	if c[2] != (tenantCounts{Handled: 2, InWindow: 1}) || c[0] != (tenantCounts{DeadLettered: 1}) || c[4] != (tenantCounts{}) {
		t.Errorf("per tenant %+v", c)
	}
}

package consumer_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// Reproduce one round with -prop.seed=N (rounds are seeded base, base+1...).
var (
	propBase   = flag.Uint64("prop.base", 1, "TestPropertyRandomFaults: seed of the first round")
	propRounds = flag.Int("prop.rounds", 0, "TestPropertyRandomFaults: rounds (0: 40, or 10 with -short)")
	propSeed   = flag.Uint64("prop.seed", 0, "TestPropertyRandomFaults: run only the round with this seed")
	propKnown  = flag.Bool("prop.knownbugs", false, "TestPropertyRandomFaults: also generate the shapes of the open bugs; run their TestProperty reproductions instead of skipping them")
	propTrace  = flag.String("prop.trace", "", "TestPropertyRandomFaults: write a trace of handler calls and engine events of failing rounds to this file")
)

// msgKind is what the handler does with one produced message.
type msgKind uint8

const (
	kindGood          msgKind = iota
	kindPanicky               // panics on its first call, then succeeds
	kindFlaky                 // fails its first flakyFails calls with a plain error, then succeeds
	kindPoison                // always fails with a plain error
	kindPermanent             // always fails with policy.Permanent
	kindNoTenant              // carries no tenant header
	kindInvalidTenant         // carries a tenant key longer than MaxTenantLen
	kindSlow                  // its first call blocks until its ctx ends (the policy's Deadline), then it succeeds
)

// maxTenantLen is the rounds' Config.MaxTenantLen; invalidTenant is longer.
const maxTenantLen = 32

var invalidTenant = strings.Repeat("k", maxTenantLen+1)

// flakyFails is below the failures any message needs before the engine
// may dead-letter it without a permanent error (it must first become
// suspect, after MaxAttempts >= 3 attempts or PoisonProbes >= 2 failed
// probes, then fail once more), so a flaky message is never dead-lettered.
const flakyFails = 2

func (k msgKind) String() string {
	return [...]string{"good", "panicky", "flaky", "poison", "permanent", "no-tenant", "invalid-tenant", "slow"}[k]
}

// mustDeadLetter reports kinds that can only end in a DLQ.
func (k msgKind) mustDeadLetter() bool {
	return k == kindPoison || k == kindPermanent || k == kindNoTenant || k == kindInvalidTenant
}

type planMsg struct {
	tenant int // -1: no tenant
	part   int
	kind   msgKind
}

type tenantPlan struct {
	outage  bool // transient outage windows
	latency bool // tiny random handler latency
	poison  bool // some messages always fail (plain error)
	perm    bool // some messages fail permanently
	flaky   bool // some messages panic once, fail a few times or time out once, then succeed
}

type faultKind uint8

const (
	faultProduce faultKind = iota
	faultOutageOn
	faultOutageOff
	faultDLQDown
	faultDLQUp
	faultRebalance
	faultRestart
	faultSpillDown
	faultSpillUp
	faultTearAppend
)

type fault struct {
	at     time.Duration
	kind   faultKind
	tenant int // outage faults
	upTo   int // produce: messages [produced, upTo)
}

// roundPlan is everything a seed decides.
type roundPlan struct {
	seed                 uint64
	parts                int
	tenants              []tenantPlan
	msgs                 []planMsg
	faults               []fault
	pol                  policy.Policy
	concurrency          int
	poisonProbes         int
	maxQueued, maxParked int
	maxParkedTotal       int
	redelivers           bool // a rebalance or restart is scheduled
	// spill: the engine has a spill log, with bounds that make it spill
	// (tenants over their backlog share, parked at their bound, or stuck).
	spill              bool
	maxQueuedPerTenant int
	stuckAfter         time.Duration
	refeedWindow       int
}

func tenantName(i int) string { return fmt.Sprintf("t%02d", i) }

// newRoundPlan draws a round from seed. With known unset it avoids the
// shapes of bugs that are open; none is open now, so every round uses all
// shapes (flaky messages in tenants with poison or outages, several outage
// windows per tenant).
func newRoundPlan(seed uint64, known bool) *roundPlan {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	dur := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	rp := &roundPlan{seed: seed, parts: 1 + rng.IntN(4)}
	rp.tenants = make([]tenantPlan, 1+rng.IntN(12))
	for i := range rp.tenants {
		tp := &rp.tenants[i]
		switch rng.IntN(6) {
		case 0, 1: // healthy
		case 2:
			tp.outage = true
		case 3:
			tp.poison = true
		case 4:
			tp.perm = true
		case 5:
			tp.outage, tp.poison = true, true
		}
		tp.latency = rng.IntN(3) == 0
		tp.flaky = rng.IntN(3) == 0 && (known || !tp.outage && !tp.poison)
	}

	// Messages, interleaved at random across tenants and partitions.
	n := 50 + rng.IntN(351)
	noTenant := rng.IntN(3) == 0
	for range n {
		m := planMsg{tenant: rng.IntN(len(rp.tenants)), part: rng.IntN(rp.parts)}
		tp := rp.tenants[m.tenant]
		switch r := rng.IntN(100); {
		case noTenant && r < 1:
			m.tenant, m.kind = -1, kindNoTenant
		case noTenant && r < 2:
			m.tenant, m.kind = -1, kindInvalidTenant
		case tp.poison && r < 6:
			m.kind = kindPoison
		case tp.perm && r < 8:
			m.kind = kindPermanent
		case tp.flaky && r < 10:
			m.kind = kindPanicky
		case tp.flaky && r < 14:
			m.kind = kindFlaky
		case tp.flaky && r < 16:
			m.kind = kindSlow
		}
		rp.msgs = append(rp.msgs, m)
	}
	rp.endPoisonedLanes()

	rp.pol = policy.Policy{
		Breaker: &policy.Breaker{
			OpenTimeout: dur(5*time.Millisecond, 20*time.Millisecond),
		},
		Retry: policy.Retry{
			MaxAttempts: 3 + rng.IntN(2),
			Backoff:     policy.Backoff{Kind: policy.Constant, Base: dur(100*time.Microsecond, time.Millisecond)},
		},
		AttemptTimeout: 20 * time.Millisecond, // ends the first call of a slow message
	}
	// Trips within one message's attempts or only after more failures (the
	// shape of policy.Default); see TestPropertyLoneMessageOutage.
	rp.pol.Breaker.ConsecutiveFailures = 2 + rng.IntN(rp.pol.Retry.MaxAttempts+1)
	rp.pol.Breaker.MaxOpenTimeout = rp.pol.Breaker.OpenTimeout * time.Duration(2+rng.IntN(3))
	rp.concurrency = 1 + rng.IntN(8)
	rp.poisonProbes = 2 + rng.IntN(2)
	tight := rng.IntN(3) == 0 // tight bounds: exercise Pause/Resume
	if tight {
		rp.maxQueued = 8 + rng.IntN(56)
		rp.maxParked = 4 + rng.IntN(30)
		if rng.IntN(2) == 0 {
			rp.maxParkedTotal = 4 + rng.IntN(60)
		}
	}

	if rng.IntN(2) == 0 {
		rp.spill = true
		rp.maxQueuedPerTenant = 2 + rng.IntN(30)
		rp.stuckAfter = dur(20*time.Millisecond, 150*time.Millisecond)
		rp.refeedWindow = 1 + rng.IntN(16)
		if rp.maxParked == 0 && rng.IntN(2) == 0 {
			rp.maxParked = 2 + rng.IntN(20)
		}
	}

	// Faults within a phase of up to 200ms; every outage and DLQ window
	// closes inside it.
	phase := dur(50*time.Millisecond, 200*time.Millisecond)
	chunks := 1 + rng.IntN(4)
	cuts := []int{0}
	for range chunks - 1 {
		cuts = append(cuts, rng.IntN(len(rp.msgs)))
	}
	slices.Sort(cuts)
	cuts = append(cuts, len(rp.msgs))
	for i := 0; i < chunks; i++ {
		at := time.Duration(0)
		if i > 0 {
			at = dur(0, phase/2)
		}
		rp.faults = append(rp.faults, fault{at: at, kind: faultProduce, upTo: cuts[i+1]})
	}
	for ti, tp := range rp.tenants {
		if !tp.outage {
			continue
		}
		t := dur(0, phase/4)
		windows := 1
		if known {
			windows += rng.IntN(3)
		}
		for range windows {
			on := t
			off := on + dur(2*time.Millisecond, 60*time.Millisecond)
			if off >= phase {
				break
			}
			rp.faults = append(rp.faults, fault{at: on, kind: faultOutageOn, tenant: ti}, fault{at: off, kind: faultOutageOff, tenant: ti})
			t = off + dur(2*time.Millisecond, 40*time.Millisecond)
		}
	}
	for range rng.IntN(3) {
		on := dur(0, phase-30*time.Millisecond)
		rp.faults = append(rp.faults, fault{at: on, kind: faultDLQDown}, fault{at: on + dur(time.Millisecond, 30*time.Millisecond), kind: faultDLQUp})
	}
	if rp.spill {
		for range rng.IntN(3) {
			on := dur(0, phase-30*time.Millisecond)
			rp.faults = append(rp.faults, fault{at: on, kind: faultSpillDown}, fault{at: on + dur(time.Millisecond, 30*time.Millisecond), kind: faultSpillUp})
		}
		for range rng.IntN(3) {
			rp.faults = append(rp.faults, fault{at: dur(0, phase), kind: faultTearAppend})
		}
	}
	if rng.IntN(2) == 0 {
		for range 1 + rng.IntN(2) {
			rp.faults = append(rp.faults, fault{at: dur(0, phase), kind: faultRebalance})
		}
		rp.redelivers = true
	}
	for range rng.IntN(5) / 2 { // none, one or two restarts
		rp.faults = append(rp.faults, fault{at: dur(0, phase), kind: faultRestart})
		rp.redelivers = true
	}
	// Stable: produce chunks in order, and a window's end after its start.
	sort.SliceStable(rp.faults, func(i, j int) bool { return rp.faults[i].at < rp.faults[j].at })
	return rp
}

// endPoisonedLanes ends every lane (tenant and partition) that holds a
// poison message with a message that can succeed: the engine needs a
// tenant success to tell poison from an outage, and a poison message with
// nothing behind it waits (by design) for one.
func (rp *roundPlan) endPoisonedLanes() {
	type lk struct{ t, p int }
	var poisoned []lk
	seen := map[lk]bool{}
	for _, m := range rp.msgs {
		k := lk{m.tenant, m.part}
		if m.kind == kindPoison && !seen[k] {
			seen[k] = true
			poisoned = append(poisoned, k)
		}
	}
	for _, k := range poisoned {
		rp.msgs = append(rp.msgs, planMsg{tenant: k.t, part: k.p, kind: kindGood})
	}
}

func (rp *roundPlan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed=%d parts=%d msgs=%d concurrency=%d poisonProbes=%d maxQueued=%d maxParked=%d/%d breaker{cf=%d open=%v max=%v} attempts=%d redelivers=%v spill=%v{perTenant=%d stuck=%v window=%d}\n",
		rp.seed, rp.parts, len(rp.msgs), rp.concurrency, rp.poisonProbes, rp.maxQueued, rp.maxParked, rp.maxParkedTotal,
		rp.pol.Breaker.ConsecutiveFailures, rp.pol.Breaker.OpenTimeout, rp.pol.Breaker.MaxOpenTimeout, rp.pol.Retry.MaxAttempts, rp.redelivers,
		rp.spill, rp.maxQueuedPerTenant, rp.stuckAfter, rp.refeedWindow)
	for i, tp := range rp.tenants {
		fmt.Fprintf(&b, "  %s %+v\n", tenantName(i), tp)
	}
	for _, f := range rp.faults {
		fmt.Fprintf(&b, "  @%v fault %d tenant %d upTo %d\n", f.at, f.kind, f.tenant, f.upTo)
	}
	return b.String()
}

// roundWorld is the shared state of one round: the handler's view of the
// faults and its record of successes.
type roundWorld struct {
	rp     *roundPlan
	outage []atomic.Bool
	calls  []atomic.Int32 // per message id

	offsets [][]int // ids by partition and offset; written by the driver only
	letters int     // dead letters at the end; set by checkRound

	mu        sync.Mutex
	reordered map[[2]int64]bool // partition, offset of each EventReordered
	trace     []string          // with -prop.trace
	handled   []int             // ids in order of successful handling
	count     []int             // successes per id
	firstAt   []int64           // position in handled of the first success, -1 none
}

var errOutage = errors.New("dependency down")

func (w *roundWorld) tracef(format string, args ...any) {
	if *propTrace == "" {
		return
	}
	w.mu.Lock()
	w.trace = append(w.trace, fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

func tn(m *consumer.Message) string {
	v, _ := m.Header(consumertest.TenantHeader)
	return string(v)
}

func (w *roundWorld) handle(ctx context.Context, m *consumer.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			w.tracef("call #%s %s p%d off %d: panic", m.Value, tn(m), m.Partition.ID, m.Offset)
			panic(r)
		}
		w.tracef("call #%s %s p%d off %d: %v", m.Value, tn(m), m.Partition.ID, m.Offset, err)
	}()
	id, err := strconv.Atoi(string(m.Value))
	if err != nil || id < 0 || id >= len(w.rp.msgs) {
		panic(fmt.Sprintf("unknown message %q", m.Value))
	}
	pm := w.rp.msgs[id]
	tp := w.rp.tenants[pm.tenant]
	call := w.calls[id].Add(1)
	if tp.latency {
		time.Sleep(time.Duration(id%5) * 50 * time.Microsecond) // simulated work
	}
	switch pm.kind {
	case kindPermanent:
		return policy.Permanent(fmt.Errorf("message %d is malformed", id))
	case kindPoison:
		return fmt.Errorf("message %d cannot be processed", id)
	case kindPanicky:
		if call == 1 {
			panic(fmt.Sprintf("message %d panics once", id))
		}
	case kindFlaky:
		if call <= flakyFails {
			return fmt.Errorf("message %d flaked", id)
		}
	case kindSlow:
		if call == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
	}
	if tp.outage && w.outage[pm.tenant].Load() {
		return errOutage
	}
	w.mu.Lock()
	if w.count[id] == 0 {
		w.firstAt[id] = int64(len(w.handled))
	}
	w.count[id]++
	w.handled = append(w.handled, id)
	w.mu.Unlock()
	return nil
}

// runningEngine is one Run of a consumer on its own source.
type runningEngine struct {
	c      *consumer.Consumer
	src    *consumertest.Source
	cancel context.CancelFunc
	done   chan error
}

func startEngine(t *testing.T, h *consumertest.MemHarness, rp *roundPlan, w *roundWorld) *runningEngine {
	t.Helper()
	var spill consumer.SpillLog
	if rp.spill {
		spill = h.Sp
	}
	c, err := consumer.New(consumer.Config{
		Spill:                 spill,
		Scope:                 scope.New(rp.pol, scope.Options[string]{}),
		Handler:               consumer.HandlerFunc(w.handle),
		Tenant:                h.Tenant(),
		DLQ:                   h.S,
		Group:                 h.Group,
		Concurrency:           rp.concurrency,
		PoisonProbes:          rp.poisonProbes,
		MaxQueuedPerPartition: rp.maxQueued,
		MaxParkedPerTenant:    rp.maxParked,
		MaxParked:             rp.maxParkedTotal,
		MaxTenantLen:          maxTenantLen,
		MaxQueuedPerTenant:    rp.maxQueuedPerTenant,
		StuckAfter:            rp.stuckAfter,
		RefeedWindow:          rp.refeedWindow,
		DrainTimeout:          2 * time.Second,
		DLQRetry:              time.Millisecond,
		Logger:                slog.New(slog.DiscardHandler),
		OnEvent: func(ev consumer.Event) {
			if ev.Kind == consumer.EventReordered {
				w.mu.Lock()
				w.reordered[[2]int64{int64(ev.Partition.ID), ev.Offset}] = true
				w.mu.Unlock()
			}
			w.tracef("event %v tenant %s p%d off %d reason %q delay %v err %v", ev.Kind, ev.Tenant, ev.Partition.ID, ev.Offset, ev.Reason, ev.Delay, ev.Err)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	src := h.B.Source(h.Group)
	ctx, cancel := context.WithCancel(context.Background())
	e := &runningEngine{c: c, src: src, cancel: cancel, done: make(chan error, 1)}
	go func() { e.done <- c.Run(ctx, src) }()
	w.tracef("engine started")
	return e
}

// stop cancels Run and waits for it, bounded.
func (e *runningEngine) stop() error {
	e.cancel()
	select {
	case err := <-e.done:
		if err != nil {
			return fmt.Errorf("Run returned %v", err)
		}
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("Run did not return within 10s of cancel")
	}
}

// TestPropertyRandomFaults runs seeded rounds of random tenants, partitions
// and handler behaviours under random faults (outage windows, a DLQ that is
// down for a while, rebalances, a restart on a new source), and checks the
// engine's contract at the end of each round: nothing lost, dead letters
// only for messages that can never succeed and only in their own tenant's
// DLQ, per-lane order up to the documented reordering, commits at the log
// end without regressions, and no goroutine left behind.
//
// The fault schedule is paced with real time on purpose (outage windows
// against real breaker timers); every wait for the engine is a bounded poll.
func TestPropertyRandomFaults(t *testing.T) {
	rounds := *propRounds
	if rounds == 0 {
		rounds = 40
		if testing.Short() {
			rounds = 10
		}
	}
	seeds := make([]uint64, rounds)
	for i := range seeds {
		seeds[i] = *propBase + uint64(i)
	}
	if *propSeed != 0 {
		seeds = []uint64{*propSeed}
	}
	base := runtime.NumGoroutine()
	var msgs, letters, reordered, again, redelivering int
	for _, seed := range seeds {
		rp := newRoundPlan(seed, true)
		problems, w := runRound(t, rp)
		msgs += len(rp.msgs)
		letters += w.letters
		reordered += len(w.reordered)
		for _, n := range w.count {
			again += max(n-1, 0)
		}
		if rp.redelivers {
			redelivering++
		}
		if len(problems) > 0 {
			if len(problems) > 20 {
				problems = append(problems[:20], fmt.Sprintf("... and %d more", len(problems)-20))
			}
			if *propTrace != "" {
				if err := os.WriteFile(fmt.Sprintf("%s.%d", *propTrace, seed), []byte(strings.Join(w.trace, "\n")), 0o644); err != nil {
					t.Log(err)
				}
			}
			t.Errorf("round seed=%d (rerun: -run TestPropertyRandomFaults -prop.seed=%d):\n  %s\nplan: %s",
				seed, seed, strings.Join(problems, "\n  "), rp)
		}
	}
	if n := settleGoroutines(base + 2); n > base+2 {
		t.Errorf("goroutines: %d before all rounds, %d after", base, n)
	}
	t.Logf("%d rounds, %d messages: %d dead letters, %d handled ahead of a suspect head, %d handled again after a redelivery (%d rounds with a rebalance or restart)",
		len(seeds), msgs, letters, reordered, again, redelivering)
}

// settleGoroutines polls the goroutine count until it is at most want
// (timers of a stopped engine may still fire for a moment), bounded.
func settleGoroutines(want int) int {
	deadline := time.Now().Add(3 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// runRound runs one plan and returns the broken invariants.
func runRound(t *testing.T, rp *roundPlan) (problems []string, w *roundWorld) {
	t.Helper()
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	before := runtime.NumGoroutine()

	h := consumertest.NewMemHarness(rp.parts)
	w = &roundWorld{
		rp:        rp,
		outage:    make([]atomic.Bool, len(rp.tenants)),
		calls:     make([]atomic.Int32, len(rp.msgs)),
		count:     make([]int, len(rp.msgs)),
		firstAt:   make([]int64, len(rp.msgs)),
		offsets:   make([][]int, rp.parts),
		reordered: map[[2]int64]bool{},
	}
	for i := range w.firstAt {
		w.firstAt[i] = -1
	}
	produced := 0
	produce := func(upTo int) {
		for ; produced < upTo; produced++ {
			m := rp.msgs[produced]
			var hs []dlq.Header
			switch {
			case m.tenant >= 0:
				hs = append(hs, dlq.Header{Key: consumertest.TenantHeader, Value: []byte(tenantName(m.tenant))})
			case m.kind == kindInvalidTenant:
				hs = append(hs, dlq.Header{Key: consumertest.TenantHeader, Value: []byte(invalidTenant)})
			}
			h.B.Append(m.part, nil, []byte(strconv.Itoa(produced)), hs...)
			w.offsets[m.part] = append(w.offsets[m.part], produced)
		}
	}

	e := startEngine(t, h, rp, w)
	start := time.Now()
	for _, f := range rp.faults {
		if d := time.Until(start.Add(f.at)); d > 0 {
			time.Sleep(d) // pacing of the fault schedule, not a wait for the engine
		}
		switch f.kind {
		case faultProduce:
			produce(f.upTo)
		case faultOutageOn:
			w.outage[f.tenant].Store(true)
			w.tracef("outage on %s", tenantName(f.tenant))
		case faultOutageOff:
			w.outage[f.tenant].Store(false)
			w.tracef("outage off %s", tenantName(f.tenant))
		case faultDLQDown:
			h.S.SetDown(true)
		case faultDLQUp:
			h.S.SetDown(false)
		case faultRebalance:
			w.tracef("rebalance")
			e.src.Rebalance()
		case faultRestart:
			if err := e.stop(); err != nil {
				fail("restart: %v", err)
				return problems, w
			}
			e = startEngine(t, h, rp, w)
		case faultSpillDown:
			h.Sp.SetDown(true)
		case faultSpillUp:
			h.Sp.SetDown(false)
		case faultTearAppend:
			h.Sp.TearNextAppend()
		}
		if err := consumer.CheckInvariants(e.c); err != nil {
			fail("invariants after fault %d: %v", f.kind, err)
		}
	}
	// Every fault is over: no outage, the DLQ works, everything produced.
	for i := range w.outage {
		w.outage[i].Store(false)
	}
	h.S.SetDown(false)
	h.Sp.SetDown(false)
	produce(len(rp.msgs))

	ends := make([]int64, rp.parts)
	for _, m := range rp.msgs {
		ends[m.part]++
	}
	drained := func() bool {
		for p := range rp.parts {
			if h.B.Committed(h.Group, p) != ends[p] {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(10 * time.Second)
	for !drained() && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	if !drained() {
		s := e.c.Stats()
		var stuck []string
		for _, ts := range s.Tenants {
			if ts.Queued > 0 {
				stuck = append(stuck, fmt.Sprintf("%s queued=%d parked=%d state=%v", ts.Tenant, ts.Queued, ts.Parked, ts.State))
			}
		}
		var commits []string
		for p := range rp.parts {
			commits = append(commits, fmt.Sprintf("p%d %d/%d", p, h.B.Committed(h.Group, p), ends[p]))
		}
		if *propTrace != "" {
			if f, err := os.Create(fmt.Sprintf("%s.%d.stacks", *propTrace, rp.seed)); err == nil {
				_ = pprof.Lookup("goroutine").WriteTo(f, 2)
				f.Close()
			}
		}
		fail("liveness: not drained 10s after the faults ended: commits %v; queued %d parked %d inflight %d; tenants %v; lanes %v",
			commits, s.Queued, s.Parked, s.InFlight, stuck, consumer.DumpLanes(e.c))
	} else {
		// Drained: the engine's counters must say so too (a handler of a
		// revoked generation may still be finishing).
		idle := func() bool {
			s := e.c.Stats()
			if s.Queued != 0 || s.Parked != 0 || s.InFlight != 0 || s.PausedPartitions != 0 {
				return false
			}
			for _, ts := range s.Tenants {
				if ts.Queued != 0 || ts.Parked != 0 {
					return false
				}
			}
			return true
		}
		if !within(2*time.Second, idle) {
			s := e.c.Stats()
			fail("stats after the drain: queued %d parked %d inflight %d paused partitions %d, lanes %v", s.Queued, s.Parked, s.InFlight, s.PausedPartitions, consumer.DumpLanes(e.c))
		}
		if n := h.Sp.Backlog(); rp.spill && !within(2*time.Second, func() bool { return h.Sp.Backlog() == 0 }) {
			fail("spill logs hold %d uncommitted entries after the drain", n)
		}
	}
	if err := consumer.CheckInvariants(e.c); err != nil {
		fail("invariants after the drain: %v", err)
	}
	if err := e.stop(); err != nil {
		fail("final stop: %v", err)
	}

	problems = append(problems, checkRound(h, rp, w, ends)...)
	if n := settleGoroutines(before); n > before+2 {
		fail("goroutine leak: %d before the round, %d after Run returned", before, n)
	}
	return problems, w
}

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

// scripted is a handler whose outcome per message value is decided by fail
// (called with the value and its 1-based call number); successes are
// recorded in order.
type scripted struct {
	fail func(value string, call int) error

	mu      sync.Mutex
	calls   map[string]int
	handled []string
}

func newScripted(fail func(value string, call int) error) *scripted {
	return &scripted{fail: fail, calls: map[string]int{}}
}

func (s *scripted) Handle(ctx context.Context, m *consumer.Message) error {
	v := string(m.Value)
	s.mu.Lock()
	s.calls[v]++
	call := s.calls[v]
	s.mu.Unlock()
	if err := s.fail(v, call); err != nil {
		return err
	}
	s.mu.Lock()
	s.handled = append(s.handled, v)
	s.mu.Unlock()
	return nil
}

func (s *scripted) callsOf(v string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[v]
}

func (s *scripted) handledAll(vs ...string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range vs {
		if !slices.Contains(s.handled, v) {
			return false
		}
	}
	return true
}

// startScripted runs an engine over h with policy p and cfg's limits.
func startScripted(t *testing.T, h *consumertest.MemHarness, p policy.Policy, cfg consumer.Config, hd consumer.Handler) *runningEngine {
	t.Helper()
	cfg.Scope = scope.New(p, scope.Options[string]{})
	cfg.Handler = hd
	cfg.Tenant = h.Tenant()
	cfg.DLQ = h.S
	cfg.Group = h.Group
	cfg.DLQRetry = time.Millisecond
	cfg.DrainTimeout = 2 * time.Second
	cfg.Logger = slog.New(slog.DiscardHandler)
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src := h.B.Source(h.Group)
	ctx, cancel := context.WithCancel(context.Background())
	e := &runningEngine{c: c, src: src, cancel: cancel, done: make(chan error, 1)}
	go func() { e.done <- c.Run(ctx, src) }()
	t.Cleanup(func() {
		if err := e.stop(); err != nil {
			t.Error(err)
		}
	})
	return e
}

// within polls cond every 2ms for up to d and reports whether it held.
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// knownBug skips a reproduction of an open engine bug unless
// -prop.knownbugs is set; remove the call once the bug is fixed.
func knownBug(t *testing.T, what string) {
	t.Helper()
	if !*propKnown {
		t.Skip("known bug: " + what + " (run with -prop.knownbugs)")
	}
}

func (s *scripted) handledList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.handled)
}

func produceValues(h *consumertest.MemHarness, tenant string, p int, values ...string) {
	for _, v := range values {
		h.B.Append(p, nil, []byte(v), dlq.Header{Key: consumertest.TenantHeader, Value: []byte(tenant)})
	}
}

func dlqValues(h *consumertest.MemHarness, tenant string) []string {
	var out []string
	for _, r := range h.S.Records(tenant, false) {
		out = append(out, string(r.Value))
	}
	return out
}

// TestPropertyPausedRebalance: a partition paused by a bound when a
// rebalance revokes and reassigns it must flow again once the pressure is
// gone.
func TestPropertyPausedRebalance(t *testing.T) {
	h := consumertest.NewMemHarness(1)
	var values []string
	for i := range 40 {
		values = append(values, fmt.Sprintf("m%02d", i))
	}
	produceValues(h, "A", 0, values...)
	var down atomic.Bool
	down.Store(true)
	hd := newScripted(func(string, int) error {
		if down.Load() {
			return errOutage
		}
		return nil
	})
	var revoked atomic.Int32
	p := consumertest.FastPolicy()
	e := startScripted(t, h, p, consumer.Config{MaxQueuedPerPartition: 8, OnEvent: func(ev consumer.Event) {
		if ev.Kind == consumer.EventRevoked {
			revoked.Add(1)
		}
	}}, hd)
	if !within(5*time.Second, func() bool { return e.c.Stats().PausedPartitions == 1 }) {
		t.Fatal("partition 0 never paused at MaxQueuedPerPartition 8")
	}
	// The outage lasts until the partition was revoked, so the engine
	// cannot resume it before.
	e.src.Rebalance()
	if !within(5*time.Second, func() bool { return revoked.Load() == 1 }) {
		t.Fatal("the rebalance did not revoke partition 0")
	}
	down.Store(false)
	if !within(5*time.Second, func() bool { return hd.handledAll(values...) }) {
		s := e.c.Stats()
		t.Fatalf("after a rebalance of the paused partition: committed %d of 40, queued %d, paused partitions %d; the source's partition stays paused",
			h.B.Committed(h.Group, 0), s.Queued, s.PausedPartitions)
	}
}

// TestPropertyLoneMessageOutage: a tenant's only message fails during an
// outage. With the default shape of policy (the breaker allows more
// consecutive failures than one message has attempts), it must wait for
// the outage to end, not be dead-lettered as exhausted.
func TestPropertyLoneMessageOutage(t *testing.T) {
	h := consumertest.NewMemHarness(1)
	produceValues(h, "A", 0, "only")
	var down atomic.Bool
	down.Store(true)
	hd := newScripted(func(string, int) error {
		if down.Load() {
			return errOutage
		}
		return nil
	})
	p := consumertest.FastPolicy()
	p.Breaker.ConsecutiveFailures = 5 // policy.Default: 5 failures, 3 attempts
	startScripted(t, h, p, consumer.Config{}, hd)
	if !within(5*time.Second, func() bool { return h.S.Total() > 0 || hd.callsOf("only") >= 7 }) {
		t.Fatal("the lone message was neither retried nor probed")
	}
	if got := dlqValues(h, "A"); len(got) != 0 {
		t.Fatalf("a lone message dead-lettered during an outage after %d calls: %v", hd.callsOf("only"), h.S.Records("A", false)[0].Reason)
	}
	down.Store(false)
	if !within(5*time.Second, func() bool { return hd.handledAll("only") }) {
		t.Fatal("the lone message was not handled after the outage")
	}
}

// TestPropertyAdjacentBadMessages: a poison message followed in its lane by
// another message that can never succeed (poison or permanent) must not
// stall the lane: both end in the DLQ and the good message after them is
// handled.
func TestPropertyAdjacentBadMessages(t *testing.T) {
	for _, second := range []string{"poison", "permanent"} {
		t.Run(second, func(t *testing.T) {
			h := consumertest.NewMemHarness(1)
			produceValues(h, "A", 0, "bad-1", "bad-2-"+second, "good")
			hd := newScripted(func(v string, _ int) error {
				switch v {
				case "bad-1", "bad-2-poison":
					return errors.New("cannot process")
				case "bad-2-permanent":
					return policy.Permanent(errors.New("malformed"))
				}
				return nil
			})
			p := consumertest.FastPolicy()
			p.Breaker.OpenTimeout, p.Breaker.MaxOpenTimeout = 5*time.Millisecond, 10*time.Millisecond
			startScripted(t, h, p, consumer.Config{PoisonProbes: 2}, hd)
			if !within(3*time.Second, func() bool { return hd.handledAll("good") && h.S.Total() == 2 }) {
				t.Fatalf("lane stalled: DLQ %v, handled %v, calls bad-1 %d bad-2 %d committed %d of 3",
					dlqValues(h, "A"), hd.handledList(), hd.callsOf("bad-1"), hd.callsOf("bad-2-"+second), h.B.Committed(h.Group, 0))
			}
		})
	}
}

// TestPropertyStaleJudge: PoisonProbes failed probes are needed before a
// head is judged as poison. A healthy message that failed PoisonProbes
// probes alone during an outage and then succeeded must not leave its lane
// marked: the next head would be judged after its first failed probe.
func TestPropertyStaleJudge(t *testing.T) {
	for _, suspect := range []bool{false, true} {
		t.Run(fmt.Sprintf("suspect-before=%v", suspect), func(t *testing.T) {
			testStaleJudge(t, suspect)
		})
	}
}

func testStaleJudge(t *testing.T, suspect bool) {
	h := consumertest.NewMemHarness(1)
	var down atomic.Bool
	down.Store(suspect)
	// flaky fails its first 4 calls: 2 while closed (trips the breaker at
	// 2), then 2 failed probes, fewer than PoisonProbes (3), then succeeds.
	hd := newScripted(func(v string, call int) error {
		if v == "flaky" && call <= 4 {
			return errors.New("flaked")
		}
		if down.Load() {
			return errOutage
		}
		return nil
	})
	p := consumertest.FastPolicy()
	p.Breaker.ConsecutiveFailures = 2
	p.Breaker.OpenTimeout, p.Breaker.MaxOpenTimeout = 5*time.Millisecond, 10*time.Millisecond
	startScripted(t, h, p, consumer.Config{PoisonProbes: 3}, hd)
	produceValues(h, "A", 0, "first")
	if suspect {
		// 2 failures trip the breaker, then PoisonProbes probes fail: the
		// lone head is now suspect.
		if !within(5*time.Second, func() bool { return hd.callsOf("first") >= 2+3+1 }) {
			t.Fatal("the lone head was not probed past PoisonProbes")
		}
		down.Store(false)
	}
	if !within(5*time.Second, func() bool { return hd.handledAll("first") }) {
		t.Fatal("the first message was not handled")
	}
	produceValues(h, "A", 0, "flaky", "next")
	if !within(5*time.Second, func() bool { return hd.handledAll("flaky", "next") || h.S.Total() > 0 }) {
		t.Fatalf("flaky and next not settled: calls %d", hd.callsOf("flaky"))
	}
	if got := dlqValues(h, "A"); len(got) != 0 {
		r := h.S.Records("A", false)[0]
		t.Fatalf("%v dead-lettered as %q after %d calls (PoisonProbes 3 failed probes never happened)", got, r.Reason, r.Attempts)
	}
	if got := hd.callsOf("flaky"); got != 5 {
		t.Fatalf("flaky called %d times, want 5 (2 closed, 2 failed probes, 1 success)", got)
	}
}

// TestPropertyRevokeWhileResuming: rebalances while parked lanes resume.
// Under -race it catches a worker that reads its lane's parked flag without
// the engine's lock while Revoked clears it (9 runs in 10 before the fix).
// Whatever the interleaving, nothing may be lost.
func TestPropertyRevokeWhileResuming(t *testing.T) {
	h := consumertest.NewMemHarness(2)
	const tenants, per = 32, 20
	var values []string
	for i := range per {
		for tn := range tenants {
			v := fmt.Sprintf("t%02d-%02d", tn, i)
			values = append(values, v)
			produceValues(h, fmt.Sprintf("t%02d", tn), tn%2, v)
		}
	}
	// Every tenant flaps: its messages fail on odd calls, so lanes park and
	// resume all the time.
	hd := newScripted(func(v string, call int) error {
		if call%2 == 1 {
			return errOutage
		}
		return nil
	})
	p := consumertest.FastPolicy()
	p.Breaker.ConsecutiveFailures = 1
	p.Breaker.OpenTimeout, p.Breaker.MaxOpenTimeout = time.Millisecond, time.Millisecond
	e := startScripted(t, h, p, consumer.Config{}, hd)
	for range 300 {
		e.src.Rebalance()
		time.Sleep(time.Millisecond) // pacing of the rebalances, not a wait for the engine
	}
	if !within(10*time.Second, func() bool { return hd.handledAll(values...) }) {
		t.Fatalf("not every message handled after the rebalances: %d distinct of %d", len(slices.Compact(slices.Sorted(slices.Values(hd.handledList())))), len(values))
	}
}

// TestPropertyEvidenceAcrossOutages: a tenant's dependency fails in two
// windows, and the tenant succeeds between them. A message that failed in
// the first window and fails again in the second is no more at fault than
// the message behind it, which fails too: nothing may be dead-lettered.
func TestPropertyEvidenceAcrossOutages(t *testing.T) {
	h := consumertest.NewMemHarness(2)
	var down atomic.Bool
	down.Store(true)
	hd := newScripted(func(v string, _ int) error {
		if down.Load() {
			return errOutage
		}
		if v == "between" {
			down.Store(true) // the second window opens right after this success
		}
		return nil
	})
	p := consumertest.FastPolicy()
	p.Breaker.ConsecutiveFailures = 10 // stays closed: the judge decides
	p.Retry.Backoff.Base = 100 * time.Millisecond
	startScripted(t, h, p, consumer.Config{}, hd)
	produceValues(h, "A", 0, "head", "behind")
	if !within(5*time.Second, func() bool { return hd.callsOf("head") >= 1 }) {
		t.Fatal("head never attempted")
	}
	// First window over; another message of the tenant succeeds while the
	// head waits for its retry, and the second window opens.
	down.Store(false)
	produceValues(h, "A", 1, "between")
	if !within(5*time.Second, func() bool { return hd.handledAll("between") }) {
		t.Fatal("the message between the windows was not handled")
	}
	if !within(5*time.Second, func() bool { return h.S.Total() > 0 || hd.callsOf("head") >= 5 }) {
		t.Fatal("head not retried in the second window")
	}
	if got := dlqValues(h, "A"); len(got) != 0 {
		r := h.S.Records("A", false)[0]
		t.Fatalf("%v dead-lettered as %q after %d calls, though the message behind it (called %d times) fails the same way",
			got, r.Reason, r.Attempts, hd.callsOf("behind"))
	}
	down.Store(false)
	if !within(5*time.Second, func() bool { return hd.handledAll("head", "behind") }) {
		t.Fatal("head and behind not handled after the outage")
	}
}

// TestPropertyJudgedNextKeepsRetries: a message that fails twice and then
// succeeds, with MaxAttempts 3, must not be dead-lettered. Here it arrives
// behind two poison messages after their judge span has grown, so its first
// attempt is in the judge round that a later message wins.
func TestPropertyJudgedNextKeepsRetries(t *testing.T) {
	h := consumertest.NewMemHarness(1)
	hd := newScripted(func(v string, call int) error {
		switch {
		case v == "poison-1" || v == "poison-2":
			return errors.New("cannot process")
		case v == "flaky" && call <= 2:
			return errors.New("flaked")
		}
		return nil
	})
	p := consumertest.FastPolicy() // 3 attempts
	p.Breaker.ConsecutiveFailures = 2
	p.Breaker.OpenTimeout, p.Breaker.MaxOpenTimeout = 5*time.Millisecond, 10*time.Millisecond
	startScripted(t, h, p, consumer.Config{PoisonProbes: 2}, hd)
	produceValues(h, "A", 0, "poison-1", "poison-2")
	// poison-2 fails in judge rounds that nothing wins: the span grows.
	if !within(5*time.Second, func() bool { return hd.callsOf("poison-2") >= 3 }) {
		t.Fatal("poison-2 was not tried as evidence")
	}
	produceValues(h, "A", 0, "flaky", "good")
	if !within(5*time.Second, func() bool { return hd.handledAll("good") && h.S.Total() >= 2 && hd.callsOf("flaky") >= 2 }) {
		t.Fatalf("not settled: DLQ %v, handled %v", dlqValues(h, "A"), hd.handledList())
	}
	if !within(5*time.Second, func() bool { return hd.handledAll("flaky") || slices.Contains(dlqValues(h, "A"), "flaky") }) {
		t.Fatal("flaky neither handled nor dead-lettered")
	}
	if got := dlqValues(h, "A"); slices.Contains(got, "flaky") {
		t.Fatalf("DLQ %v: flaky dead-lettered after %d calls, with 3 attempts allowed", got, hd.callsOf("flaky"))
	}
}

// TestPropertyLoneEvidenceAcrossOutages: the lone-head form of
// TestPropertyEvidenceAcrossOutages. A tenant's only message on its
// partition becomes suspect in an outage; between two outage windows a
// message of the tenant on another partition succeeds; the head then fails
// in the second window. That success was not simultaneous with the head's
// failures: nothing may be dead-lettered.
func TestPropertyLoneEvidenceAcrossOutages(t *testing.T) {
	h := consumertest.NewMemHarness(2)
	var down atomic.Bool
	down.Store(true)
	suspect := make(chan struct{})
	var once sync.Once
	hd := newScripted(func(v string, call int) error {
		if down.Load() {
			if v == "head" && call == 4 {
				// 3 attempts, then the judge's own try: the head is now a
				// suspect waiting out its backoff.
				once.Do(func() { close(suspect) })
			}
			return errOutage
		}
		if v == "between" {
			down.Store(true) // the second window opens right after this success
		}
		return nil
	})
	p := consumertest.FastPolicy() // 3 attempts
	p.Breaker.ConsecutiveFailures = 10
	p.Retry.Backoff.Base = 250 * time.Millisecond // room for "between" to run first
	e := startScripted(t, h, p, consumer.Config{}, hd)
	produceValues(h, "A", 0, "head")
	select {
	case <-suspect:
	case <-time.After(5 * time.Second):
		t.Fatal("the head did not become suspect")
	}
	// Its fourth failure is recorded before the tenant's next success.
	if !within(5*time.Second, func() bool { return e.c.Stats().Failed >= 4 }) {
		t.Fatal("the head's fourth failure was not recorded")
	}
	down.Store(false)
	produceValues(h, "A", 1, "between")
	if !within(5*time.Second, func() bool { return h.S.Total() > 0 || hd.callsOf("head") >= 6 }) {
		t.Fatal("head not retried in the second window")
	}
	if got := dlqValues(h, "A"); len(got) != 0 {
		r := h.S.Records("A", false)[0]
		t.Fatalf("%v dead-lettered as %q after %d calls, all of them in outage windows", got, r.Reason, r.Attempts)
	}
	down.Store(false)
	if !within(5*time.Second, func() bool { return hd.handledAll("head", "between") }) {
		t.Fatal("head not handled after the outage")
	}
}

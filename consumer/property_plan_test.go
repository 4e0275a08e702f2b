package consumer_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// Reproduce one round with -prop.seed=N (rounds are seeded base, base+1...).
var (
	propBase   = flag.Uint64("prop.base", 1, "TestPropertyRandomFaults: seed of the first round")
	propRounds = flag.Int("prop.rounds", 0, "TestPropertyRandomFaults: rounds (0: 40, or 10 with -short)")
	propSeed   = flag.Uint64("prop.seed", 0, "TestPropertyRandomFaults: run only the round with this seed")
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
	kindSlow                  // its first call blocks until its ctx ends (the policy's AttemptTimeout), then it succeeds
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
	faultControlOn  // an operator holds or quarantines a tenant (SetControls)
	faultControlOff // and releases it
)

type fault struct {
	at     time.Duration
	kind   faultKind
	tenant int // outage and control faults
	upTo   int // produce: messages [produced, upTo)
	// quarantine: a control fault quarantines the tenant rather than
	// holding it.
	quarantine bool
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
	// readAhead: Config.ReadAhead (0: the default, which tight bounds turn
	// off); drawn from a generator of its own, so that the rest of a
	// seed's round does not depend on it.
	readAhead int
	// maxIdle: Config.MaxIdleTenants (0: the default, above any round's
	// tenants); small, so that tenants and lanes are forgotten between
	// their messages. From a generator of its own too.
	maxIdle int
}

func tenantName(i int) string { return fmt.Sprintf("t%02d", i) }

// newRoundPlan draws a round from seed.
func newRoundPlan(seed uint64) *roundPlan {
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
		tp.flaky = rng.IntN(3) == 0
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
	// shape of policy.Default); see TestLoneMessageWaitsOutAnOutage.
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

	ra := rand.New(rand.NewPCG(seed, 0xa11ead))
	if ra.IntN(2) == 0 {
		limit := 64
		if rp.maxQueued > 0 {
			limit = rp.maxQueued
		}
		rp.readAhead = 2 + ra.IntN(limit-1) // below the partition's bound: on
	}
	if mi := rand.New(rand.NewPCG(seed, 0x1d1e)); mi.IntN(3) > 0 {
		rp.maxIdle = 1 + mi.IntN(4)
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
		for range 1 + rng.IntN(3) { // one to three windows
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
	// Operators' controls, from a stream of their own so that the other
	// faults of a seed stay what they were: in half the rounds, a window
	// or two in which a tenant is held or quarantined.
	rc := rand.New(rand.NewPCG(seed, 0xc0de))
	if rc.IntN(2) == 0 && len(rp.tenants) > 0 {
		for range 1 + rc.IntN(2) {
			ti := rc.IntN(len(rp.tenants))
			on := time.Duration(rc.Int64N(int64(phase / 2)))
			off := on + time.Duration(rc.Int64N(int64(phase/2)))
			q := rc.IntN(2) == 0
			rp.faults = append(rp.faults, fault{at: on, kind: faultControlOn, tenant: ti, quarantine: q}, fault{at: off, kind: faultControlOff, tenant: ti})
		}
	}
	// Stable: produce chunks in order, and a window's end after its start.
	sort.SliceStable(rp.faults, func(i, j int) bool { return rp.faults[i].at < rp.faults[j].at })
	return rp
}

// endPoisonedLanes ends every lane (tenant and partition) that holds
// poison messages with twice as many messages that can succeed: the engine
// needs a tenant success behind each poison message to tell it from an
// outage (see TestRunOfPoisonNeedsASuccessBehindEach) and, when another
// message waits behind that one, a second success after the poison
// message's last failure (a confirmer: see
// TestSuspectHeadFailingAfterTheWinnerIsConfirmed); a poison message with
// none behind it waits (by design) for one.
func (rp *roundPlan) endPoisonedLanes() {
	type lk struct{ t, p int }
	var poisoned []lk
	count := map[lk]int{}
	for _, m := range rp.msgs {
		k := lk{m.tenant, m.part}
		if m.kind == kindPoison {
			if count[k] == 0 {
				poisoned = append(poisoned, k)
			}
			count[k]++
		}
	}
	for _, k := range poisoned {
		for range 2 * count[k] {
			rp.msgs = append(rp.msgs, planMsg{tenant: k.t, part: k.p, kind: kindGood})
		}
	}
}

func (rp *roundPlan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed=%d parts=%d msgs=%d concurrency=%d poisonProbes=%d maxQueued=%d maxParked=%d/%d breaker{cf=%d open=%v max=%v} attempts=%d redelivers=%v spill=%v{perTenant=%d stuck=%v window=%d} readAhead=%d maxIdle=%d\n",
		rp.seed, rp.parts, len(rp.msgs), rp.concurrency, rp.poisonProbes, rp.maxQueued, rp.maxParked, rp.maxParkedTotal,
		rp.pol.Breaker.ConsecutiveFailures, rp.pol.Breaker.OpenTimeout, rp.pol.Breaker.MaxOpenTimeout, rp.pol.Retry.MaxAttempts, rp.redelivers,
		rp.spill, rp.maxQueuedPerTenant, rp.stuckAfter, rp.refeedWindow, rp.readAhead, rp.maxIdle)
	for i, tp := range rp.tenants {
		fmt.Fprintf(&b, "  %s %+v\n", tenantName(i), tp)
	}
	for _, f := range rp.faults {
		fmt.Fprintf(&b, "  @%v fault %d tenant %d upTo %d\n", f.at, f.kind, f.tenant, f.upTo)
	}
	return b.String()
}

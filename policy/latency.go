package policy

import (
	"math"
	"sync/atomic"
	"time"
)

// Latency: which attempts are timed, the streaming quantile estimate fed by
// them, and the two things derived from it: the slow-call baseline (and so
// the derived slow-call threshold) and the adaptive concurrency limit.
// Everything here runs on sampled attempts only, off the untimed success
// path. The estimators are updated with plain loads and stores, not CAS
// loops: two samples racing may lose one, which an estimator tolerates, and
// every value stored is within its bounds whatever the interleaving.

// warmSamples is how many attempts are all timed before sampling starts,
// so that a new guard has an estimate at once; a derived slow-call
// threshold applies from then on.
const warmSamples = 32

// baselineDoubling is how fast the slow-call baseline drifts up while
// samples keep coming in above the threshold: at most a doubling per
// baselineDoubling of slow samples (and one per slow sample), so that a
// permanent shift is eventually accepted but the slowness the threshold is
// meant to catch is not learned as normal in the meantime.
const baselineDoubling = time.Minute

// The gradient limit (Netflix concurrency-limits' Gradient2), per guard.
const (
	gradientTolerance = 1.5  // short latency up to 1.5x long is no reason to shrink
	gradientSmoothing = 0.2  // weight of a new limit against the old one
	gradientLong      = 600  // samples in the long-term EWMA
	gradientMinGrad   = 0.5  // the steepest cut per update, before smoothing
	adaptiveMax       = 1000 // the cap when neither MaxConcurrent nor the engine gives one
)

// latencyState is the part of a guard written on sampled attempts. Its
// fields are reset one by one with atomic stores (see guard.init):
// Guard.Latency, Guard.Concurrency and OpenError read them without
// counting in.
type latencyState struct {
	est   atomic.Int64  // the quantile estimate, ns; 0 until the first sample
	base  atomic.Int64  // the slow-call baseline, ns; 0 until the first sample
	drift atomic.Int64  // when base last drifted up, ns since epoch (at least 1); 0: not in a run of slow samples
	long  atomic.Uint64 // float64 bits: long-term latency, a slow EWMA of est
	limit atomic.Uint64 // float64 bits: the gradient limit, in [1, cap]; 0: at the cap, no update yet
	hint  atomic.Int64  // the def last given to Concurrency: the cap when MaxConcurrent is 0
}

// Latency returns the guard's current latency estimate (the configured
// quantile of attempt durations; zero before the first sample). It is two
// atomic loads, for engine stats.
func (h *Guard) Latency() time.Duration {
	g := h.st.Load()
	l := g.lat.est.Load()
	if g.pool != nil && g.life.Load() != h.gen {
		return 0 // retired: its next call runs on a fresh state
	}
	return time.Duration(l)
}

// begin reads the start of the attempt p is about to make, as the attempt
// needs it. One attempt in Latency.SampleEvery, chosen by the random r (its
// top 30 bits mapped onto [0, SampleEvery) by a multiply), is a latency
// sample: the exact clock is read. Any other attempt is checked for
// slowness only: with the system clock it reads the coarse clock (one
// atomic load), with an injected Clock that Clock.
func (g *guard) begin(p *Permit, r uint32) {
	if n := g.r.sampleEvery; n <= 1 || g.samples.Load() < warmSamples || (uint64(r>>2)*uint64(n))>>30 == 0 {
		p.start, p.timed, p.clock = g.now(), true, clockExact
		return
	}
	if g.r.slowClock == clockCoarse {
		if v, fresh := coarseNow(); fresh {
			p.start, p.clock = v, clockCoarse
			return
		}
	} else if g.r.slowClock == clockNone {
		return
	}
	// An injected Clock, or the coarse clock is idle.
	p.start, p.clock = g.now(), clockExact
}

// observe feeds one attempt duration d, which ended at now, to the
// estimates. The slow-call baseline learns from successes only (ok): it is
// what a success normally takes, and failures may be timeouts.
func (g *guard) observe(d, now int64, ok bool) {
	if g.samples.Load() < warmSamples {
		g.samples.Add(1)
	}
	d = max(d, 1) // a zero duration is a valid sample
	est := g.lat.est.Load()
	if next := quantileStep(est, d, g.r.quantile); next != est {
		est = next
		g.lat.est.Store(est)
	}
	if g.r.slowDerived && ok {
		g.observeBaseline(d, now)
	}
	if g.r.adaptive {
		g.adapt(est)
	}
}

// quantileStep is one step of the streaming estimate of quantile q:
// stochastic gradient descent on the pinball loss with a step proportional
// to the estimate, so it tracks any scale in O(1) memory. The first sample
// is the estimate.
func quantileStep(est, d int64, q float64) int64 {
	if est == 0 {
		return d
	}
	step := max(est/16, 1)
	switch {
	case d > est:
		return est + max(int64(float64(step)*q), 1)
	case d < est:
		return max(est-max(int64(float64(step)*(1-q)), 1), 1)
	}
	return est
}

// observeBaseline feeds the slow-call baseline, from which a derived
// threshold is max(Floor, Factor x baseline). The baseline is the same
// quantile as the estimate, but of the successes under the threshold only,
// so it does not chase the slowness it is meant to detect: while samples
// come in above the threshold it only drifts up, by at most a doubling per
// baselineDoubling and never past what would accept the sample. A
// dependency that moves for good from latency L to L' > Factor x L is so
// accepted after about log2(L'/(Factor x L)) minutes of slow samples (1ms
// to 500ms: about 7 minutes, 8 with the breaker parking the caller between
// probes); until then its calls are slow calls. Growth accrues over a run
// of slow samples; a sample under the threshold ends the run.
func (g *guard) observeBaseline(d, now int64) {
	b := g.lat.base.Load()
	drifted := false
	if b == 0 || d <= g.slowAt.Load() {
		b = quantileStep(b, d, g.r.quantile)
		if g.lat.drift.Load() != 0 {
			g.lat.drift.Store(0) // a run of slow samples ended
		}
	} else {
		// Growth accrues over a run of slow samples, from the first one
		// (which only starts the clock), and at most a doubling per
		// sample: a parked tenant probes rarely.
		var dt int64
		if last := g.lat.drift.Load(); last != 0 {
			dt = min(max(now-last, 0), int64(baselineDoubling))
		}
		grown := int64(min(float64(b)*math.Exp2(float64(dt)/float64(baselineDoubling)), math.MaxInt64/2))
		accept := int64(math.Ceil(float64(d) / g.r.slowFactor))
		b = max(b, min(grown, accept))
		g.lat.drift.Store(max(now, 1))
		drifted = true
	}
	g.lat.base.Store(b)
	if g.samples.Load() < warmSamples {
		return // warming up: no threshold yet
	}
	// Stored only when it moves by more than an eighth, or drifted:
	// slowAt is on the line every attempt reads, and the check needs no
	// finer threshold; a drift is stored exactly, so that a sample the
	// drift has come to accept is accepted.
	thr := g.r.derivedThreshold(b)
	if old := g.slowAt.Load(); drifted || old == math.MaxInt64 || thr > old+old/8 || thr < old-old/8 {
		g.slowAt.Store(thr)
	}
}

// derivedThreshold is max(Floor, Factor x baseline), in ns.
func (r *resolved) derivedThreshold(base int64) int64 {
	return max(int64(r.slowFloor), int64(min(r.slowFactor*float64(base), math.MaxInt64/2)))
}

// adapt updates the gradient limit from the short-term latency short (the
// quantile estimate), after Gradient2: the long-term latency is a slow EWMA
// of the short one; the gradient is tolerance x long/short, clamped to
// [0.5, 1]; the new limit is limit x gradient plus a queue allowance of
// sqrt(limit)/2, smoothed, and clamped to [1, cap]. While latency holds, the
// gradient is 1 and the limit climbs to the cap; when it rises several-fold
// the gradient is 0.5 and the limit falls toward 1 (the allowance is sized
// so that 1 is where the steepest gradient settles); as the long-term
// latency catches up, or when latency recovers (a long term more than twice
// the short term decays toward it), the limit climbs back.
func (g *guard) adapt(short int64) {
	s := float64(short)
	long := math.Float64frombits(g.lat.long.Load())
	if long == 0 {
		long = s
	} else {
		long += (s - long) / gradientLong
	}
	if long > 2*s {
		long *= 0.95
	}
	g.lat.long.Store(math.Float64bits(long))
	c := float64(g.limitCap())
	lim := math.Float64frombits(g.lat.limit.Load())
	if lim == 0 {
		lim = c
	}
	grad := max(gradientMinGrad, min(1, gradientTolerance*long/s))
	next := lim*grad + math.Sqrt(lim)/2
	next = lim*(1-gradientSmoothing) + next*gradientSmoothing
	g.lat.limit.Store(math.Float64bits(max(1, min(c, next))))
}

// limitCap is the cap of the gradient limit: MaxConcurrent, or else the
// engine's default last given to Concurrency, or else adaptiveMax.
func (g *guard) limitCap() int64 {
	if g.r.maxConcurrent > 0 {
		return int64(g.r.maxConcurrent)
	}
	if h := g.lat.hint.Load(); h > 0 {
		return h
	}
	return adaptiveMax
}

// adaptiveLimit is the gradient limit: the cap until the first update.
func (g *guard) adaptiveLimit() float64 {
	if l := math.Float64frombits(g.lat.limit.Load()); l > 0 {
		return l
	}
	return float64(g.limitCap())
}

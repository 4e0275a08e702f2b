package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// Scenario is the traffic and the faults of one demo run. Zero fields mean
// the defaults written on each.
type Scenario struct {
	// Tenants is how many tenants send traffic. Zero means 20; at least 3.
	Tenants int
	// Rate is the messages per second each tenant sends. Zero means 25.
	Rate int
	// Duration is how long traffic is produced in each run. Zero means 8s.
	Duration time.Duration
	// FaultStart and FaultEnd bound the outage tenant's outage, from the
	// start of the run. Zero means 25% and 65% of Duration.
	FaultStart, FaultEnd time.Duration
	// OutageWeight multiplies the outage tenant's rate: it is a big tenant,
	// the noisy neighbour. Zero means 4.
	OutageWeight int
	// PoisonEvery makes every PoisonEvery-th message of the poison tenant a
	// poison message. Zero means 20.
	PoisonEvery int
	// Partitions is the partition count of the Kafka topic. Zero means 4.
	Partitions int
	// Latency is the simulated dependency's least latency; each call takes
	// between Latency and twice it. Zero means 1ms.
	Latency time.Duration
	// Settle bounds the wait, after production ends, for every message to be
	// handled or dead-lettered. Zero means 30s.
	Settle time.Duration
	// Policy is the per-tenant (or shared) guard template. Nil means
	// DemoPolicy().
	Policy *policy.Policy
}

func (s Scenario) withDefaults() Scenario {
	if s.Tenants == 0 {
		s.Tenants = 20
	}
	if s.Rate == 0 {
		s.Rate = 25
	}
	if s.Duration == 0 {
		s.Duration = 8 * time.Second
	}
	if s.FaultStart == 0 && s.FaultEnd == 0 {
		s.FaultStart = s.Duration / 4
		s.FaultEnd = s.Duration * 65 / 100
	}
	if s.PoisonEvery == 0 {
		s.PoisonEvery = 20
	}
	if s.OutageWeight == 0 {
		s.OutageWeight = 4
	}
	if s.Partitions == 0 {
		s.Partitions = 4
	}
	if s.Latency == 0 {
		s.Latency = time.Millisecond
	}
	if s.Settle == 0 {
		s.Settle = 30 * time.Second
	}
	if s.Policy == nil {
		p := DemoPolicy()
		s.Policy = &p
	}
	return s
}

func (s Scenario) validate() error {
	switch {
	case s.Tenants < 3:
		return fmt.Errorf("demo: at least 3 tenants are needed (one outage, one poison, one healthy), got %d", s.Tenants)
	case s.Tenants > 10000:
		return fmt.Errorf("demo: at most 10000 tenants, got %d", s.Tenants)
	case s.Rate < 1 || s.Rate > 1000:
		return fmt.Errorf("demo: rate must be in [1, 1000] per tenant, got %d", s.Rate)
	case s.Duration < time.Second || s.Duration > 10*time.Minute:
		return fmt.Errorf("demo: duration must be in [1s, 10m], got %v", s.Duration)
	case s.FaultStart < 0 || s.FaultEnd <= s.FaultStart || s.FaultEnd > s.Duration:
		return fmt.Errorf("demo: fault window [%v, %v) must lie within the duration %v", s.FaultStart, s.FaultEnd, s.Duration)
	case s.OutageWeight < 1 || s.OutageWeight > 100:
		return fmt.Errorf("demo: outage weight must be in [1, 100], got %d", s.OutageWeight)
	case s.PoisonEvery < 2:
		return fmt.Errorf("demo: PoisonEvery must be at least 2, got %d", s.PoisonEvery)
	case s.Partitions < 1:
		return fmt.Errorf("demo: partitions must be positive, got %d", s.Partitions)
	}
	return nil
}

// DemoPolicy is the guard template of the demo: a breaker that opens after
// 5 consecutive failures or a failure ratio of 25% over 2s (at least 20
// calls), for 500ms doubling up to 2s; 3 attempts with exponential backoff
// from 20ms; and a 1s deadline.
func DemoPolicy() policy.Policy {
	return policy.Policy{
		Breaker: &policy.Breaker{
			ConsecutiveFailures: 5,
			FailureRatio:        0.25, Window: 2 * time.Second, MinRequests: 20,
			OpenTimeout: 500 * time.Millisecond, MaxOpenTimeout: 2 * time.Second,
		},
		Retry: policy.Retry{
			MaxAttempts: 3,
			Backoff:     policy.Backoff{Kind: policy.Exponential, Base: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		},
		Deadline: time.Second,
	}
}

// Mode is how a run guards its handler.
type Mode int

// Modes, in the order the demo runs them.
const (
	// Baseline: per-tenant guards and no outage.
	Baseline Mode = iota
	// PerTenant: per-tenant guards (ringfence) with the outage.
	PerTenant
	// Shared: one guard for every message with the outage.
	Shared
)

// Modes lists the modes in run order.
var Modes = []Mode{Baseline, PerTenant, Shared}

func (m Mode) String() string {
	switch m {
	case Baseline:
		return "baseline"
	case PerTenant:
		return "ringfence"
	case Shared:
		return "shared"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Title describes the mode in a sentence fragment.
func (m Mode) Title() string {
	switch m {
	case Baseline:
		return "baseline: per-tenant guards, no outage"
	case PerTenant:
		return "ringfence: per-tenant guards, outage"
	case Shared:
		return "shared: one breaker for every tenant, outage"
	}
	return m.String()
}

// sharedKey is the one engine tenant of a Shared run.
const sharedKey = "all-tenants"

var (
	errDependencyDown = errors.New("dependency unavailable")
	errPoison         = errors.New("poison message: cannot be processed")
	errMalformed      = errors.New("malformed demo message")
)

// plan is the traffic of a run: the same for every mode. Message ids are
// in the order they are due.
type plan struct {
	sc      Scenario
	tenants []string
	outage  int // tenant index
	poison  int // tenant index
	total   int
	owner   []int           // tenant index, by id
	due     []time.Duration // from the start of the run, by id
	kinds   []byte          // by id
}

func newPlan(sc Scenario) *plan {
	p := &plan{sc: sc}
	for i := range sc.Tenants {
		p.tenants = append(p.tenants, fmt.Sprintf("tenant-%02d", i+1))
	}
	p.outage = (sc.Tenants - 1) / 3
	p.poison = 2 * (sc.Tenants - 1) / 3
	if p.poison == p.outage {
		p.poison = p.outage + 1
	}
	type msg struct {
		t, k int
		at   time.Duration
	}
	var all []msg
	for t := range sc.Tenants {
		rate := float64(sc.Rate)
		if t == p.outage {
			rate *= float64(sc.OutageWeight)
		}
		n := int(sc.Duration.Seconds() * rate)
		// Tenants are staggered evenly within each 1/Rate period.
		phase := float64(t) / float64(sc.Tenants) / float64(sc.Rate)
		for k := range n {
			all = append(all, msg{t: t, k: k, at: time.Duration((float64(k)/rate + phase) * float64(time.Second))})
		}
	}
	slices.SortStableFunc(all, func(a, b msg) int { return cmp.Compare(a.at, b.at) })
	p.total = len(all)
	perT := make([]int, sc.Tenants)
	for _, m := range all {
		perT[m.t]++
	}
	for _, m := range all {
		kind := byte(kindOK)
		// Never two poison messages in a row, never the tenant's last one:
		// a good message follows each and shows that it alone is at fault.
		if m.t == p.poison && m.k%sc.PoisonEvery == sc.PoisonEvery/2 && m.k < perT[m.t]-1 {
			kind = kindPoison
		}
		p.owner = append(p.owner, m.t)
		p.due = append(p.due, m.at)
		p.kinds = append(p.kinds, kind)
	}
	return p
}

func (p *plan) poisonCount() int {
	n := 0
	for _, k := range p.kinds {
		if k == kindPoison {
			n++
		}
	}
	return n
}

func (p *plan) healthy(t int) bool { return t != p.outage && t != p.poison }

// TenantResult is one tenant's outcome in one run.
type TenantResult struct {
	Tenant string
	// Role is "outage", "poison" or "".
	Role string
	// Handled counts distinct messages handled.
	Handled int
	// InWindow counts those first handled during the outage window.
	InWindow int
	// DeadLettered counts distinct messages read back from the DLQ.
	DeadLettered int
	// MaxParked is the most messages seen parked at once (-1 when the
	// engine did not track this tenant on its own: Shared).
	MaxParked int
	// Trips counts breaker openings of this tenant's guard (-1: Shared).
	Trips int
}

// RunResult is the outcome of one run.
type RunResult struct {
	Mode     Mode
	Produced int
	// HealthyInWindow is the healthy tenants' goodput during the outage
	// window: their messages first handled within it.
	HealthyInWindow int
	// OutageDead and PoisonDead are the dead letters of the outage and the
	// poison tenant; OtherDead those of everyone else.
	OutageDead, PoisonDead, OtherDead int
	// Lost counts produced messages neither handled nor dead-lettered.
	Lost int
	// Redelivered counts handler successes for a message already handled.
	Redelivered int
	// SharedTrips counts the shared breaker's openings (Shared only).
	SharedTrips int
	// MaxParked is the most messages parked at once, all tenants.
	MaxParked int
	Tenants   []TenantResult
	// Elapsed is the run's wall time from the first message produced to
	// the last one settled.
	Elapsed time.Duration
}

// Snapshot is the live state of a run, passed to the view.
type Snapshot struct {
	Broker    string
	Mode      Mode
	Elapsed   time.Duration
	Duration  time.Duration
	FaultOn   bool
	Producing bool
	Rows      []Row
	// Totals.
	Produced, Handled, Dead, Parked, Backlog int
	// SharedState is the shared breaker's state (Shared only).
	SharedState policy.State
}

// Row is one tenant in a Snapshot.
type Row struct {
	Tenant                         string
	Role                           string
	Handled, Backlog, Parked, Dead int
	State                          policy.State
	TrackedAlone                   bool // Parked and State are this tenant's own
}

// runState is the bookkeeping of one run.
type runState struct {
	p        *plan
	mode     Mode
	start    atomic.Int64 // unix ns; 0 until production starts
	handled  []atomic.Int64
	dead     []atomic.Bool
	produced []atomic.Int64 // per tenant
	tHandled []atomic.Int64 // per tenant, distinct
	tDead    []atomic.Int64 // per tenant, distinct (from the sink)
	settled  atomic.Int64
	redeliv  atomic.Int64
	trips    sync.Map // engine key -> *atomic.Int64
}

func newRunState(p *plan, mode Mode) *runState {
	return &runState{
		p: p, mode: mode,
		handled:  make([]atomic.Int64, p.total),
		dead:     make([]atomic.Bool, p.total),
		produced: make([]atomic.Int64, len(p.tenants)),
		tHandled: make([]atomic.Int64, len(p.tenants)),
		tDead:    make([]atomic.Int64, len(p.tenants)),
	}
}

func (st *runState) elapsed() time.Duration {
	s := st.start.Load()
	if s == 0 {
		return 0
	}
	return time.Duration(time.Now().UnixNano() - s)
}

func (st *runState) faultOn(el time.Duration) bool {
	return st.mode != Baseline && el >= st.p.sc.FaultStart && el < st.p.sc.FaultEnd
}

// Handle is the demo's handler: poison messages always fail, the outage
// tenant's calls fail during the outage, and everything else calls a
// dependency that takes Latency to 2*Latency.
func (st *runState) Handle(ctx context.Context, m *consumer.Message) error {
	tenant, id, kind, ok := decodeValue(m.Value)
	if !ok || id >= st.p.total || st.p.tenants[st.p.owner[id]] != tenant {
		return policy.Permanent(errMalformed)
	}
	if kind == kindPoison {
		return errPoison
	}
	if st.p.owner[id] == st.p.outage && st.faultOn(st.elapsed()) {
		return errDependencyDown
	}
	lat := st.p.sc.Latency
	t := time.NewTimer(lat + rand.N(lat))
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
	if st.handled[id].CompareAndSwap(0, int64(st.elapsed())+1) {
		st.tHandled[st.p.owner[id]].Add(1)
		if !st.dead[id].Load() {
			st.settled.Add(1)
		}
	} else {
		st.redeliv.Add(1)
	}
	return nil
}

// countingSink counts dead letters by the real tenant, read from the value.
type countingSink struct {
	next dlq.Sink
	st   *runState
}

func (s countingSink) Write(ctx context.Context, r *dlq.Record) error {
	if err := s.next.Write(ctx, r); err != nil {
		return err
	}
	if _, id, _, ok := decodeValue(r.Value); ok && id < s.st.p.total {
		if s.st.dead[id].CompareAndSwap(false, true) {
			s.st.tDead[s.st.p.owner[id]].Add(1)
			if s.st.handled[id].Load() == 0 {
				s.st.settled.Add(1)
			}
		}
	}
	return nil
}

// readySource tells when the source has its first partition.
type readySource struct {
	consumer.Source
	once  sync.Once
	ready chan struct{}
}

type readyDispatcher struct {
	consumer.Dispatcher
	s *readySource
}

func (d readyDispatcher) Assigned(p consumer.Partition) {
	d.Dispatcher.Assigned(p)
	d.s.once.Do(func() { close(d.s.ready) })
}

func (s *readySource) Run(ctx context.Context, d consumer.Dispatcher) error {
	return s.Source.Run(ctx, readyDispatcher{d, s})
}

// runConfig is what a run needs besides the scenario.
type runConfig struct {
	broker   Broker
	logger   *slog.Logger
	observe  func(Snapshot)                        // called every tick; may be nil
	consumer func(*consumer.Consumer, Mode) func() // registers metrics; returns unregister
	onEvent  func(consumer.Event)                  // the console's event log; may be nil
	tick     time.Duration
}

// runMode runs the plan once in mode on a fresh topic of the broker.
func runMode(ctx context.Context, p *plan, mode Mode, rc runConfig) (RunResult, error) {
	sc := p.sc
	name := fmt.Sprintf("ringfence-demo-%s-%d", mode, time.Now().UnixNano())
	topic, err := rc.broker.Open(ctx, name, sc.Partitions)
	if err != nil {
		return RunResult{}, fmt.Errorf("demo: %s: open %s: %w", rc.broker.Name(), name, err)
	}
	defer topic.Close()

	st := newRunState(p, mode)
	tenantFn := topic.Tenant()
	if mode == Shared {
		// One key for every message: one guard, one breaker, one lane per
		// partition. This is a consumer with a single circuit breaker.
		tenantFn = func(*consumer.Message) (string, error) { return sharedKey, nil }
	}
	sco := scope.New(*sc.Policy, scope.Options[string]{
		OnEvent: func(key string, e policy.Event) {
			if e.Kind != policy.EventBreakerOpened {
				return
			}
			v, _ := st.trips.LoadOrStore(key, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		},
	})
	// One key for everything (Shared) is a plain consumer: nothing to
	// spill a tenant away from.
	var spill consumer.SpillLog
	if sp, ok := topic.(spillTopic); ok && mode != Shared {
		if spill, err = sp.SpillLog(name); err != nil {
			return RunResult{}, fmt.Errorf("demo: %s: spill log: %w", rc.broker.Name(), err)
		}
	}
	c, err := consumer.New(consumer.Config{
		Scope:        sco,
		Handler:      st,
		Tenant:       tenantFn,
		DLQ:          countingSink{next: topic.Sink(), st: st},
		Spill:        spill,
		Group:        name,
		Logger:       rc.logger,
		DrainTimeout: 5 * time.Second,
		OnEvent:      rc.onEvent,
	})
	if err != nil {
		return RunResult{}, err
	}
	if rc.consumer != nil {
		defer rc.consumer(c, mode)()
	}
	raw, err := topic.Source(name, tenantFn, mode == Shared)
	if err != nil {
		return RunResult{}, fmt.Errorf("demo: %s: source: %w", rc.broker.Name(), err)
	}
	src := &readySource{Source: raw, ready: make(chan struct{})}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(runCtx, src) }()

	select {
	case <-src.ready:
	case err := <-runErr:
		return RunResult{}, fmt.Errorf("demo: %s: consumer stopped before it was assigned: %w", rc.broker.Name(), err)
	case <-time.After(30 * time.Second):
		return RunResult{}, fmt.Errorf("demo: %s: consumer not assigned a partition within 30s", rc.broker.Name())
	case <-ctx.Done():
		return RunResult{}, ctx.Err()
	}

	maxParked := make([]int, len(p.tenants))
	totalMaxParked := 0
	sample := func(producing bool) Snapshot {
		stats := c.Stats()
		snap := Snapshot{Broker: rc.broker.Name(), Mode: mode, Elapsed: st.elapsed(), Duration: sc.Duration, Producing: producing}
		snap.FaultOn = st.faultOn(snap.Elapsed)
		snap.Parked = stats.Parked
		totalMaxParked = max(totalMaxParked, stats.Parked)
		byKey := make(map[string]consumer.TenantStats, len(stats.Tenants))
		for _, ts := range stats.Tenants {
			byKey[ts.Tenant] = ts
		}
		shared := byKey[sharedKey]
		snap.SharedState = shared.State
		for i, name := range p.tenants {
			r := Row{Tenant: name, Role: p.role(i), Handled: int(st.tHandled[i].Load()), Dead: int(st.tDead[i].Load())}
			r.Backlog = max(int(st.produced[i].Load())-r.Handled-r.Dead, 0)
			if mode == Shared {
				r.Parked, r.State = -1, shared.State
			} else {
				ts := byKey[name]
				r.Parked, r.State, r.TrackedAlone = ts.Parked, ts.State, true
				maxParked[i] = max(maxParked[i], ts.Parked)
			}
			snap.Rows = append(snap.Rows, r)
			snap.Handled += r.Handled
			snap.Dead += r.Dead
			snap.Backlog += r.Backlog
			snap.Produced += int(st.produced[i].Load())
		}
		return snap
	}

	start := time.Now()
	st.start.Store(start.UnixNano())
	prodErr := make(chan error, 1)
	go func() { prodErr <- produce(runCtx, p, topic, st) }()

	tick := rc.tick
	if tick <= 0 {
		tick = 100 * time.Millisecond
	}
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	producing := true
	deadline := time.Time{}
	var failure error
loop:
	for {
		select {
		case err := <-prodErr:
			producing = false
			prodErr = nil
			if err != nil {
				failure = fmt.Errorf("demo: %s: produce: %w", rc.broker.Name(), err)
				break loop
			}
			deadline = time.Now().Add(sc.Settle)
		case err := <-runErr:
			failure = fmt.Errorf("demo: %s: consumer stopped: %w", rc.broker.Name(), err)
			runErr = nil
			break loop
		case <-ctx.Done():
			failure = ctx.Err()
			break loop
		case <-ticker.C:
			snap := sample(producing)
			if rc.observe != nil {
				rc.observe(snap)
			}
			if !producing && (int(st.settled.Load()) >= p.total || time.Now().After(deadline)) {
				break loop
			}
		}
	}
	elapsed := time.Since(start)
	stop()
	if runErr != nil {
		if err := <-runErr; err != nil && failure == nil {
			failure = fmt.Errorf("demo: %s: consumer: %w", rc.broker.Name(), err)
		}
	}
	if failure != nil {
		return RunResult{}, failure
	}

	res := RunResult{Mode: mode, Produced: p.total, Elapsed: elapsed, MaxParked: totalMaxParked, Redelivered: int(st.redeliv.Load())}
	// Dead letters are counted from what the broker durably holds.
	keys := p.tenants
	if mode == Shared {
		keys = []string{sharedKey}
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	recs, err := topic.DeadLetters(rctx, keys)
	cancel()
	if err != nil {
		return RunResult{}, fmt.Errorf("demo: %s: read dead letters back: %w", rc.broker.Name(), err)
	}
	deadIDs := make([]bool, p.total)
	tDead := make([]int, len(p.tenants))
	for _, r := range recs {
		if _, id, _, ok := decodeValue(r.Value); ok && id < p.total && !deadIDs[id] {
			deadIDs[id] = true
			tDead[p.owner[id]]++
		}
	}
	win0, win1 := sc.FaultStart, sc.FaultEnd
	for i, name := range p.tenants {
		tr := TenantResult{Tenant: name, Role: p.role(i), DeadLettered: tDead[i], MaxParked: -1, Trips: -1}
		if mode != Shared {
			tr.MaxParked = maxParked[i]
			tr.Trips = st.tripsOf(name)
		}
		res.Tenants = append(res.Tenants, tr)
		switch i {
		case p.outage:
			res.OutageDead += tDead[i]
		case p.poison:
			res.PoisonDead += tDead[i]
		default:
			res.OtherDead += tDead[i]
		}
	}
	for id := range p.total {
		t := p.owner[id]
		h := st.handled[id].Load()
		if h != 0 {
			res.Tenants[t].Handled++
			at := time.Duration(h - 1)
			if at >= win0 && at < win1 {
				res.Tenants[t].InWindow++
				if p.healthy(t) {
					res.HealthyInWindow++
				}
			}
		} else if !deadIDs[id] {
			res.Lost++
		}
	}
	if mode == Shared {
		res.SharedTrips = st.tripsOf(sharedKey)
	}
	return res, nil
}

func (st *runState) tripsOf(key string) int {
	if v, ok := st.trips.Load(key); ok {
		return int(v.(*atomic.Int64).Load())
	}
	return 0
}

func (p *plan) role(t int) string {
	switch t {
	case p.outage:
		return "outage"
	case p.poison:
		return "poison"
	}
	return ""
}

// produce sends the plan's messages on schedule, in batches every 10ms.
func produce(ctx context.Context, p *plan, topic Topic, st *runState) error {
	const every = 10 * time.Millisecond
	t := time.NewTicker(every)
	defer t.Stop()
	next := 0
	var batch []Msg
	for next < p.total {
		el := st.elapsed()
		batch = batch[:0]
		first := next
		for next < p.total && p.due[next] <= el {
			tenant := p.tenants[p.owner[next]]
			batch = append(batch, Msg{Tenant: tenant, Value: encodeValue(tenant, next, p.kinds[next])})
			next++
		}
		if len(batch) > 0 {
			if err := topic.Produce(ctx, batch); err != nil {
				return err
			}
			for id := first; id < next; id++ {
				st.produced[p.owner[id]].Add(1)
			}
		}
		if next == p.total {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

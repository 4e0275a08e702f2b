package demo

// One run of a scenario in one mode: start the consumer, produce, sample lag
// and heap, drain, read back what is missing. runMode is one sequence that
// reads top to bottom (its state is in state.go), hence the file's length.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// sharedKey is the one engine tenant of a Shared run.
const sharedKey = "all-tenants"

var (
	errDependencyDown = errors.New("dependency unavailable")
	errPoison         = errors.New("poison message: cannot be processed")
	errMalformed      = errors.New("malformed demo message")
)

// Sampling periods: the live view and the heap every tick, the commit lag
// (a broker round trip) every lagEvery.
const (
	defaultTick = 100 * time.Millisecond
	lagEvery    = 500 * time.Millisecond
	lagTimeout  = 5 * time.Second
)

// readBackMargin is how long the restart read-back waits beyond the
// broker's redelivery delay.
const readBackMargin = 15 * time.Second

// gcEvery is how often the run forces a garbage collection, so that the
// live heap it samples (marked by the last GC) is never older than this.
const gcEvery = 5 * time.Second

// maxReordered bounds the EventReordered records kept of the bad tenant.
const maxReordered = 1 << 20

// runConfig is what a run needs besides the scenario.
type runConfig struct {
	broker   Broker
	logger   *slog.Logger
	observe  func(Snapshot)                        // called every tick; may be nil
	consumer func(*consumer.Consumer, Mode) func() // registers metrics; returns unregister
	onEvent  func(consumer.Event)                  // also receives the engine's events (the console); may be nil
	tick     time.Duration
	tracing  consumer.Tracing // the ringfence run's; zero traces nothing
}

// started is a consumer running on a topic.
type started struct {
	c      *consumer.Consumer
	stop   context.CancelFunc
	runErr chan error
}

// startConsumer builds a consumer of group on topic with h and sink, runs
// it, and returns once the source has its first partition.
func startConsumer(ctx context.Context, topic Topic, group string, mode Mode, sc Scenario, h consumer.Handler, sink dlq.Sink, onEvent func(consumer.Event), trips func(key string, stalled bool), rc runConfig) (*started, error) {
	tenantFn := topic.Tenant()
	if mode == Shared {
		// One key for every message: one guard, one breaker, one lane per
		// partition. This is a consumer with a single circuit breaker.
		tenantFn = func(*consumer.Message) (string, error) { return sharedKey, nil }
	}
	opts := scope.Options[string]{}
	if trips != nil {
		opts.OnEvent = tripCounter(trips)
	}
	var spill consumer.SpillLog
	if st, ok := topic.(spillTopic); ok && mode != Shared {
		// A plain single-breaker consumer has no spill log: the Shared run
		// stays what most stacks run.
		var err error
		if spill, err = st.SpillLog(group); err != nil {
			return nil, fmt.Errorf("demo: %s: spill log: %w", rc.broker.Name(), err)
		}
	}
	c, err := consumer.New(consumer.Config{
		Spill:        spill,
		Scope:        scope.New(*sc.Policy, opts),
		Handler:      h,
		Tenant:       tenantFn,
		DLQ:          sink,
		Group:        group,
		Logger:       rc.logger,
		DrainTimeout: sc.ShutdownTimeout,
		OnEvent:      onEvent,
		Tracing:      rc.tracing,
	})
	if err != nil {
		return nil, err
	}
	raw, err := topic.Source(group, tenantFn, mode == Shared)
	if err != nil {
		return nil, fmt.Errorf("demo: %s: source: %w", rc.broker.Name(), err)
	}
	src := &readySource{Source: raw, ready: make(chan struct{})}
	runCtx, stop := context.WithCancel(ctx)
	s := &started{c: c, stop: stop, runErr: make(chan error, 1)}
	go func() { s.runErr <- c.Run(runCtx, src) }()
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-src.ready:
		return s, nil
	case err := <-s.runErr:
		stop()
		return nil, fmt.Errorf("demo: %s: consumer stopped before it was assigned: %w", rc.broker.Name(), err)
	case <-t.C:
		stop()
		<-s.runErr
		return nil, fmt.Errorf("demo: %s: consumer not assigned a partition within 30s", rc.broker.Name())
	case <-ctx.Done():
		stop()
		<-s.runErr
		return nil, ctx.Err()
	}
}

// halt stops the consumer (a graceful drain) and returns Run's error.
func (s *started) halt() error {
	s.stop()
	return <-s.runErr
}

// liveHeap is the heap marked live by the last GC.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// runMode runs plan p once in mode on a fresh topic of the broker: traffic,
// the deadline, the drain, the restart read-back and the DLQ read-back.
func runMode(ctx context.Context, p *plan, g groups, mode Mode, rc runConfig) (RunResult, error) {
	sc := p.sc
	name := fmt.Sprintf("ringfence-demo-%s-%s-%d", sc.Kind, mode, time.Now().UnixNano())
	topic, err := rc.broker.Open(ctx, name, sc.Partitions)
	if err != nil {
		return RunResult{}, fmt.Errorf("demo: %s: open %s: %w", rc.broker.Name(), name, err)
	}
	defer topic.Close()

	st := newRunState(p, g, mode, name)
	trips := func(key string, stalled bool) {
		count(&st.trips, key)
		if stalled {
			count(&st.stallTrips, key)
		}
	}
	onEvent := st.onEvent
	if rc.onEvent != nil {
		onEvent = func(e consumer.Event) { st.onEvent(e); rc.onEvent(e) }
	}
	sink := countingSink{next: outageSink{next: topic.Sink(), st: st}, st: st}
	run, err := startConsumer(ctx, topic, name, mode, sc, st, sink, onEvent, trips, rc)
	if err != nil {
		return RunResult{}, err
	}
	if rc.consumer != nil {
		defer rc.consumer(run.c, mode)()
	}
	c := run.c

	maxParked := make([]int, len(p.tenants))
	totalMaxParked := 0
	var rescues uint64
	var heap []heapSample
	sample := func(producing bool) Snapshot {
		stats := c.Stats()
		snap := Snapshot{Broker: rc.broker.Name(), Kind: sc.Kind, Mode: mode, Elapsed: st.elapsed(), Duration: sc.Duration, Producing: producing}
		snap.FaultOn = st.faultOn(snap.Elapsed)
		snap.Parked = stats.Parked
		snap.Lag = st.lastLag.Load()
		snap.Heap = liveHeap()
		heap = append(heap, heapSample{snap.Elapsed, snap.Heap})
		totalMaxParked = max(totalMaxParked, stats.Parked)
		var rescued uint64
		for _, ps := range stats.Partitions {
			rescued += ps.Rescues
		}
		rescues = max(rescues, rescued) // a revoked partition's count goes with it
		byKey := make(map[string]consumer.TenantStats, len(stats.Tenants))
		for _, ts := range stats.Tenants {
			byKey[ts.Tenant] = ts
		}
		shared := byKey[sharedKey]
		snap.SharedState = shared.State
		for i, name := range p.tenants {
			r := Row{Tenant: name, Role: p.role(i), Handled: int(st.tHandled[i].Load()), Dead: int(st.tDead[i].Load())}
			r.Backlog = max(int(st.tProduced[i].Load())-r.Handled-r.Dead, 0)
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
			snap.Produced += int(st.tProduced[i].Load())
		}
		return snap
	}

	// The consumer's heap is what grows beyond this: the plan and the
	// run's bookkeeping are allocated, the previous run collected.
	runtime.GC()
	heapBefore := liveHeap()

	start := time.Now()
	st.start.Store(start.UnixNano())
	prodCtx, stopProd := context.WithCancel(ctx)
	defer stopProd()
	prodErr := make(chan error, 1)
	go func() { prodErr <- produce(prodCtx, p, topic, st) }()
	lagCtx, stopLag := context.WithCancel(ctx)
	lagDone := make(chan []lagSample, 1)
	go func() { lagDone <- sampleLag(lagCtx, topic, name, st, rc.logger) }()

	tick := rc.tick
	if tick <= 0 {
		tick = defaultTick
	}
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	producing := true
	deadlineAt := never // elapsed
	var deadline, drainLimit, lastProgress time.Time
	lastSettled := int64(-1)
	var failure error
	runErr := run.runErr
	lastGC := time.Now()
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
			drainLimit = deadline.Add(sc.Drain)
			deadlineAt = deadline.Sub(start)
		case err := <-runErr:
			failure = fmt.Errorf("demo: %s: consumer stopped: %w", rc.broker.Name(), err)
			runErr = nil
			break loop
		case <-ctx.Done():
			failure = ctx.Err()
			break loop
		case <-ticker.C:
			if time.Since(lastGC) >= gcEvery {
				runtime.GC()
				lastGC = time.Now()
			}
			snap := sample(producing)
			if rc.observe != nil {
				rc.observe(snap)
			}
			if producing {
				continue
			}
			now := time.Now()
			if n := st.settled.Load(); n != lastSettled {
				lastSettled, lastProgress = n, now
			}
			switch {
			case int(lastSettled) >= p.total:
				break loop
			case now.Before(deadline):
			case now.After(drainLimit), now.Sub(lastProgress) >= sc.Stall:
				break loop
			}
		}
	}
	drainEnd := st.elapsed()
	elapsed := time.Since(start)
	stopLag()
	lagSamples := <-lagDone
	stopProd()
	if runErr != nil {
		if err := run.halt(); err != nil && failure == nil {
			failure = fmt.Errorf("demo: %s: consumer: %w", rc.broker.Name(), err)
		}
	} else {
		run.stop()
	}
	if failure != nil {
		return RunResult{}, failure
	}

	tl := st.timeline(deadlineAt, drainEnd, lagSamples, heapBefore, heap)
	res := RunResult{
		Mode: mode, Ran: true,
		Redelivered:         int(st.redeliv.Load()),
		PartitionMismatches: int(st.mismatch.Load()),
		MaxParked:           totalMaxParked,
		Rescues:             rescues,
		Elapsed:             elapsed,
		Drained:             max(drainEnd-deadlineAt, 0),
	}

	// Restart read-back: what the run left neither handled nor
	// dead-lettered may still be in the broker, uncommitted (unacked); a
	// fresh consumer of the group finds it, or it is lost.
	missing := make([]bool, p.total)
	want := 0
	for id := range missing {
		if tl.produced[id] != never && tl.handled[id] == never && tl.dead[id] == never {
			missing[id] = true
			want++
		}
	}
	if want > 0 {
		// Never call a message lost before the broker could have handed
		// it over again.
		bound := sc.ReadBack
		if d := topic.RedeliveryAfter(); d > 0 {
			bound = max(bound, d+readBackMargin)
		}
		began := time.Now()
		found, err := readBack(ctx, topic, name, mode, sc, missing, want, bound, rc)
		if err != nil {
			return RunResult{}, err
		}
		tl.recovered = found
		res.ReadBack = time.Since(began)
	}

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
	for _, r := range recs {
		if v, ok := decodeValue(r.Value); ok && v.id < p.total {
			tl.inDLQ[v.id] = true
		}
	}

	res.figures = tl.compute()
	for i, c := range tl.perTenant(len(p.tenants)) {
		tr := TenantResult{
			Tenant: p.tenants[i], Role: p.role(i), Partition: g.part[i], Mate: g.mates[i],
			Handled: c.Handled, InWindow: c.InWindow, DeadLettered: c.DeadLettered,
			MaxParked: -1, Trips: -1, StallTrips: -1,
		}
		if mode != Shared {
			tr.MaxParked = maxParked[i]
			tr.Trips = countOf(&st.trips, p.tenants[i])
			tr.StallTrips = countOf(&st.stallTrips, p.tenants[i])
		}
		res.Tenants = append(res.Tenants, tr)
	}
	if mode == Shared {
		res.SharedTrips = countOf(&st.trips, sharedKey)
	}
	return res, nil
}

// timeline copies what st recorded into the figures' input.
func (st *runState) timeline(deadline, drainEnd time.Duration, lag []lagSample, heapBefore uint64, heap []heapSample) *timeline {
	p := st.p
	at := func(v int64) time.Duration {
		if v == 0 {
			return never
		}
		return time.Duration(v - 1)
	}
	tl := &timeline{
		mode: st.mode, owner: p.owner, kinds: p.kinds, bad: p.bad, poison: p.poison,
		healthy: make([]bool, len(p.tenants)), mates: st.g.mates,
		faultStart: p.sc.FaultStart, faultEnd: p.sc.FaultEnd,
		produced: make([]time.Duration, p.total), handled: make([]time.Duration, p.total),
		latency: make([]time.Duration, p.total), fromBroker: make([]time.Duration, p.total), order: make([]uint64, p.total),
		dead: make([]time.Duration, p.total), inDLQ: make([]bool, p.total),
		recovered: make([]bool, p.total), reordered: make([]bool, p.total),
		deadline: deadline, drainEnd: drainEnd, lag: lag, heapBefore: heapBefore, heap: heap,
		badParks: int(st.badParks.Load()),
	}
	for t := range p.tenants {
		tl.healthy[t] = p.healthy(t)
	}
	for id := range p.total {
		tl.produced[id] = at(st.produced[id].Load())
		tl.handled[id] = at(st.handled[id].Load())
		tl.latency[id] = time.Duration(st.latency[id].Load())
		tl.fromBroker[id] = time.Duration(st.fromBrk[id].Load())
		tl.order[id] = st.order[id].Load()
		tl.dead[id] = at(st.dead[id].Load())
	}
	st.mu.Lock()
	refs := st.reordered
	st.mu.Unlock()
	if len(refs) > 0 {
		byRef := make(map[msgRef]int)
		for id := range p.total {
			if int(p.owner[id]) == p.bad && tl.order[id] != 0 {
				byRef[msgRef{st.part[id].Load(), st.offset[id].Load()}] = id
			}
		}
		for _, r := range refs {
			if id, ok := byRef[r]; ok {
				tl.reordered[id] = true
			}
		}
	}
	return tl
}

// tripCounter is a run's scope OnEvent: it reports each breaker opening of
// a key to trips, and whether a stall caused it: a slow call, or a call
// past the policy's Deadline.
func tripCounter(trips func(key string, stalled bool)) func(string, policy.Event) {
	return func(key string, e policy.Event) {
		if e.Kind == policy.EventBreakerOpened {
			trips(key, errors.Is(e.Err, policy.ErrSlowCall) || errors.Is(e.Err, context.DeadlineExceeded))
		}
	}
}

// count adds one to key's count in m (engine key -> *atomic.Int64).
func count(m *sync.Map, key string) {
	v, _ := m.LoadOrStore(key, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// countOf is key's count in m.
func countOf(m *sync.Map, key string) int {
	if v, ok := m.Load(key); ok {
		return int(v.(*atomic.Int64).Load())
	}
	return 0
}

// sampleLag reads the group's commit lag every lagEvery until ctx ends.
// A failed read is logged and skipped (the figure says how many samples it
// rests on).
func sampleLag(ctx context.Context, topic Topic, group string, st *runState, log *slog.Logger) []lagSample {
	var out []lagSample
	t := time.NewTicker(lagEvery)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, lagTimeout)
		parts, err := topic.Lag(rctx, group)
		cancel()
		if err == nil {
			var m int64
			for _, l := range parts {
				m = max(m, l)
			}
			st.lastLag.Store(m)
			out = append(out, lagSample{at: st.elapsed(), parts: parts})
		} else if ctx.Err() == nil {
			log.Debug("demo: commit lag", "err", err)
		}
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
	}
}

// readBack runs a fresh consumer of group with a handler that only notes
// which of the missing messages it is given, until it has seen all want of
// them or bound passed: what a restart of the consumer would still get.
func readBack(ctx context.Context, topic Topic, group string, mode Mode, sc Scenario, missing []bool, want int, bound time.Duration, rc runConfig) ([]bool, error) {
	found := make([]atomic.Bool, len(missing))
	var n atomic.Int64
	h := consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
		if v, ok := decodeValue(m.Value); ok && v.id < len(missing) && missing[v.id] && found[v.id].CompareAndSwap(false, true) {
			n.Add(1)
		}
		return nil
	})
	s, err := startConsumer(ctx, topic, group, mode, sc, h, topic.Sink(), nil, nil, rc)
	if err != nil {
		return nil, fmt.Errorf("demo: %s: restart read-back: %w", rc.broker.Name(), err)
	}
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
wait:
	for n.Load() < int64(want) {
		select {
		case <-deadline.C:
			break wait
		case <-ctx.Done():
			break wait
		case <-poll.C:
		}
	}
	if err := s.halt(); err != nil {
		rc.logger.Warn("demo: restart read-back consumer", "err", err)
	}
	out := make([]bool, len(missing))
	for i := range found {
		out[i] = found[i].Load()
	}
	return out, ctx.Err()
}

// produce sends the plan's messages on schedule, in batches every 10ms,
// each stamped with the time it was produced.
func produce(ctx context.Context, p *plan, topic Topic, st *runState) error {
	const every = 10 * time.Millisecond
	t := time.NewTicker(every)
	defer t.Stop()
	start := st.start.Load()
	next := 0
	var batch []Msg
	for next < p.total {
		el := st.elapsed()
		batch = batch[:0]
		first := next
		stamp := time.Now().UnixNano()
		for next < p.total && p.due[next] <= el {
			tenant := p.tenants[p.owner[next]]
			batch = append(batch, Msg{Tenant: tenant, Value: encodeValue(tenant, next, p.kinds[next], stamp)})
			next++
		}
		if len(batch) > 0 {
			if err := topic.Produce(ctx, batch); err != nil {
				return err
			}
			for id := first; id < next; id++ {
				st.produced[id].Store(stamp - start + 1)
				st.tProduced[p.owner[id]].Add(1)
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

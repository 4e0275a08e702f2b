package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// Handler handles one message. ctx is cancelled when the engine gives up on
// the attempt (the policy's Deadline, or shutdown past DrainTimeout).
// Return nil for success, an error marked with policy.Permanent for a
// message that can never succeed, and any other error for a transient
// failure.
type Handler interface {
	Handle(ctx context.Context, m *Message) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, m *Message) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, m *Message) error { return f(ctx, m) }

// Config configures a Consumer. Zero fields mean the defaults written on
// each; New validates it.
type Config struct {
	// Scope holds one guard per tenant. Nil means
	// scope.New(policy.Default(), scope.Options[string]{}).
	Scope *scope.Scope[string]
	// Handler handles messages. Required.
	Handler Handler
	// Tenant extracts the tenant key. Required.
	Tenant TenantFunc
	// DLQ receives dead letters. Required.
	DLQ dlq.Sink
	// Group names the consumer group or durable, recorded in dead letters.
	Group string

	// Concurrency is how many messages are handled at once, across all
	// tenants. Zero means 64.
	Concurrency int
	// MaxParkedPerTenant bounds the messages one parked tenant may hold in
	// memory; past it, the partition the next one arrives on is paused.
	// Zero means 1000.
	MaxParkedPerTenant int
	// MaxParked bounds parked messages across all tenants. Zero means
	// 100000.
	MaxParked int
	// MaxQueuedPerPartition bounds messages waiting for a worker per
	// partition (parked ones included); past it the partition is paused
	// until half of them are gone. Zero means 10000.
	MaxQueuedPerPartition int
	// PoisonProbes is how many probes in a row a tenant's head message may
	// fail before the tenant's next message is tried as a probe instead; if
	// that one succeeds the head is dead-lettered as poison. Zero means 3.
	PoisonProbes int
	// MaxTenantLen is the longest tenant key accepted, in bytes; longer keys
	// are dead-lettered with reason invalid-tenant. Zero means 4096.
	MaxTenantLen int
	// DrainTimeout is how long Run waits for in-flight handlers on shutdown
	// before cancelling their ctx. Zero means 30s.
	DrainTimeout time.Duration
	// DLQRetry is the wait between attempts to write a dead letter while the
	// DLQ is failing; it doubles up to 30s. Zero means 100ms.
	DLQRetry time.Duration
	// OnEvent, if set, receives engine events synchronously. It must be
	// cheap and safe for concurrent use.
	OnEvent func(Event)
	// Logger receives warnings (DLQ or settle failures). Nil means
	// slog.Default().
	Logger *slog.Logger
}

// maxIdleTenants is how many tenants without lanes keep their counters in
// Stats before they are forgotten.
const maxIdleTenants = 4096

// ErrInvalidConfig: New was given an unusable Config.
var ErrInvalidConfig = errors.New("consumer: invalid config")

// Consumer runs messages from a Source through per-tenant guards. It is
// safe for concurrent use; Run may be called once.
//
// Locking: mu guards parts, lanes, tenants, the ready queue, the parked
// counters and every lane's queue and flags. Each partState's own mu guards
// its watermark and serialises Settle/Commit calls for that partition. Lock
// order: Consumer.mu before partState.mu.
type Consumer struct {
	cfg    Config
	scope  *scope.Scope[string]
	log    *slog.Logger
	src    Source
	hctx   context.Context // handler context; cancelled past DrainTimeout
	cancel context.CancelFunc

	mu          sync.Mutex
	cond        *sync.Cond
	parts       map[Partition]*partState
	lanes       map[laneKey]*lane
	tenants     map[string]*tenantState
	ready       []*lane
	readyHead   int
	draining    bool
	parkedTotal int
	partGen     uint64
	sweepAt     int // lanes count that triggers the next idle sweep

	handled, failed, dead, panics, retried atomic.Uint64
	inflight                               atomic.Int64
}

type laneKey struct {
	tenant string
	part   Partition
}

// lane is one tenant's ordered stream from one partition.
type lane struct {
	key      laneKey
	t        *tenantState
	ps       *partState
	q        []*Message // queue; q[head:] are live
	head     int
	running  bool // owned by a worker or by a pending timer
	parked   bool // refused by the breaker; its messages count as parked
	dead     bool // partition revoked
	seen     bool // touched since the last idle sweep
	noTenant bool
	// judge, when set, means the head is suspect and says why (exhausted,
	// panic or poison); see (*Consumer).judge. judgeSpan is how many of the
	// following messages the next judge may try (1 at first, doubling after
	// each judge in which they all failed too, up to maxJudgeSpan).
	judge     dlq.Reason
	judgeSpan int
}

func (l *lane) len() int { return len(l.q) - l.head }

func (l *lane) front() *Message { return l.q[l.head] }

func (l *lane) push(m *Message) { l.q = append(l.q, m) }

// remove takes out the message at offset i from the head.
func (l *lane) remove(i int) {
	j := l.head + i
	if i == 0 {
		l.q[j] = nil
		l.head++
	} else {
		copy(l.q[j:], l.q[j+1:])
		l.q[len(l.q)-1] = nil
		l.q = l.q[:len(l.q)-1]
	}
	if l.head == len(l.q) {
		l.q = l.q[:0]
		l.head = 0
	} else if l.head > 32 && l.head*2 > len(l.q) {
		n := copy(l.q, l.q[l.head:])
		clear(l.q[n:])
		l.q = l.q[:n]
		l.head = 0
	}
}

type tenantState struct {
	name                  string
	lanes                 int
	parked                int // parked messages of this tenant
	queued                int
	handled, failed, dead uint64
	pinned                int // parked lanes holding a scope pin
}

type partState struct {
	p       Partition
	gen     uint64
	queued  int  // messages in this partition's lanes (c.mu)
	paused  bool // c.mu
	mu      sync.Mutex
	wm      watermark // mu
	live    bool      // mu; false once revoked
	laneSet map[*lane]struct{}
}

// New validates cfg and builds a Consumer.
func New(cfg Config) (*Consumer, error) {
	switch {
	case cfg.Handler == nil:
		return nil, fmt.Errorf("%w: Handler is required", ErrInvalidConfig)
	case cfg.Tenant == nil:
		return nil, fmt.Errorf("%w: Tenant is required", ErrInvalidConfig)
	case cfg.DLQ == nil:
		return nil, fmt.Errorf("%w: DLQ is required", ErrInvalidConfig)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"Concurrency", int64(cfg.Concurrency)},
		{"MaxParkedPerTenant", int64(cfg.MaxParkedPerTenant)},
		{"MaxParked", int64(cfg.MaxParked)},
		{"MaxQueuedPerPartition", int64(cfg.MaxQueuedPerPartition)},
		{"PoisonProbes", int64(cfg.PoisonProbes)},
		{"MaxTenantLen", int64(cfg.MaxTenantLen)},
		{"DrainTimeout", int64(cfg.DrainTimeout)},
		{"DLQRetry", int64(cfg.DLQRetry)},
	} {
		if f.v < 0 {
			return nil, fmt.Errorf("%w: %s must not be negative, got %d", ErrInvalidConfig, f.name, f.v)
		}
	}
	cfg.Concurrency = orInt(cfg.Concurrency, 64)
	cfg.MaxParkedPerTenant = orInt(cfg.MaxParkedPerTenant, 1000)
	cfg.MaxParked = orInt(cfg.MaxParked, 100000)
	cfg.MaxQueuedPerPartition = orInt(cfg.MaxQueuedPerPartition, 10000)
	cfg.PoisonProbes = orInt(cfg.PoisonProbes, 3)
	cfg.MaxTenantLen = orInt(cfg.MaxTenantLen, 4096)
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.DLQRetry == 0 {
		cfg.DLQRetry = 100 * time.Millisecond
	}
	c := &Consumer{
		cfg:     cfg,
		scope:   cfg.Scope,
		log:     cfg.Logger,
		parts:   make(map[Partition]*partState),
		lanes:   make(map[laneKey]*lane),
		tenants: make(map[string]*tenantState),
		sweepAt: 4096,
	}
	if c.scope == nil {
		c.scope = scope.New(policy.Default(), scope.Options[string]{})
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	c.cond = sync.NewCond(&c.mu)
	return c, nil
}

func orInt(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

// Scope returns the consumer's tenant scope.
func (c *Consumer) Scope() *scope.Scope[string] { return c.scope }

// Run feeds src's messages through the engine until ctx is cancelled or the
// source fails, then drains: it pauses every partition, lets in-flight
// handlers finish (up to DrainTimeout), settles and commits what finished,
// stops the source and returns. Messages still queued or parked are left
// unsettled, to be redelivered. It returns nil after a shutdown through ctx,
// or the source's error.
func (c *Consumer) Run(ctx context.Context, src Source) error {
	c.mu.Lock()
	if c.src != nil {
		c.mu.Unlock()
		return errors.New("consumer: Run called twice")
	}
	c.src = src
	c.mu.Unlock()

	c.hctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	defer c.cancel()
	srcCtx, stopSrc := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSrc()

	var workers sync.WaitGroup
	for range c.cfg.Concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			c.worker()
		}()
	}

	srcDone := make(chan error, 1)
	go func() { srcDone <- src.Run(srcCtx, c) }()

	var srcErr error
	stopped := false
	select {
	case <-ctx.Done():
	case srcErr = <-srcDone:
		stopped = true
	}

	// Drain: no new work, in-flight work finishes, then the source stops.
	c.mu.Lock()
	c.draining = true
	for _, ps := range c.parts {
		if !ps.paused {
			ps.paused = true
			src.Pause(ps.p)
		}
	}
	c.cond.Broadcast()
	c.mu.Unlock()

	drained := make(chan struct{})
	go func() { workers.Wait(); close(drained) }()
	timer := time.NewTimer(c.cfg.DrainTimeout)
	select {
	case <-drained:
	case <-timer.C:
		c.log.Warn("consumer: drain timeout; cancelling in-flight handlers", "timeout", c.cfg.DrainTimeout)
		c.cancel()
		<-drained
	}
	timer.Stop()

	stopSrc()
	if !stopped {
		srcErr = <-srcDone
	}
	if errors.Is(srcErr, context.Canceled) && ctx.Err() != nil {
		srcErr = nil
	}
	return srcErr
}

// Assigned implements Dispatcher.
func (c *Consumer) Assigned(p Partition) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partition(p)
}

// partition returns p's state, creating it if needed. Called with mu held.
func (c *Consumer) partition(p Partition) *partState {
	ps := c.parts[p]
	if ps == nil {
		c.partGen++
		ps = &partState{p: p, gen: c.partGen, wm: newWatermark(), live: true, laneSet: make(map[*lane]struct{})}
		c.parts[p] = ps
		if c.draining {
			ps.paused = true
			c.src.Pause(p)
		}
	}
	return ps
}

// Revoked implements Dispatcher.
func (c *Consumer) Revoked(p Partition) {
	c.mu.Lock()
	ps := c.parts[p]
	if ps == nil {
		c.mu.Unlock()
		return
	}
	delete(c.parts, p)
	for l := range ps.laneSet {
		c.dropLane(l)
	}
	if ps.paused && !c.draining {
		// The pause was the engine's, for state it just dropped.
		ps.paused = false
		c.src.Resume(p)
	}
	c.mu.Unlock()
	ps.mu.Lock()
	ps.live = false
	ps.wm = newWatermark()
	ps.mu.Unlock()
	c.emit(Event{Kind: EventRevoked, Partition: p})
}

// dropLane forgets a lane of a revoked partition. Called with mu held.
func (c *Consumer) dropLane(l *lane) {
	n := l.len()
	if l.parked {
		c.unparkCounts(l)
	}
	l.t.queued -= n
	l.ps.queued -= n
	clear(l.q)
	l.q, l.head = nil, 0
	l.dead = true
	c.forgetLane(l)
}

// forgetLane removes an idle or dead lane from the maps. Called with mu held.
func (c *Consumer) forgetLane(l *lane) {
	if c.lanes[l.key] == l {
		delete(c.lanes, l.key)
	}
	delete(l.ps.laneSet, l)
	l.t.lanes--
	if l.t.lanes == 0 && l.t.pinned == 0 && len(c.tenants) > maxIdleTenants {
		delete(c.tenants, l.t.name)
	}
}

// Deliver implements Dispatcher.
func (c *Consumer) Deliver(m *Message) {
	tenant, terr := c.cfg.Tenant(m)
	if terr == nil && tenant == "" {
		terr = ErrNoTenant
	}
	if terr == nil && len(tenant) > c.cfg.MaxTenantLen {
		terr = fmt.Errorf("consumer: tenant key of %d bytes exceeds MaxTenantLen %d", len(tenant), c.cfg.MaxTenantLen)
	}
	c.mu.Lock()
	ps := c.parts[m.Partition]
	if ps == nil {
		ps = c.partition(m.Partition)
	}
	m.gen = ps.gen
	ps.mu.Lock()
	m.seq = ps.wm.push(m.Offset)
	ps.mu.Unlock()
	m.st = msgState{tenantErr: terr}

	key := laneKey{tenant: tenant, part: m.Partition}
	if terr != nil {
		key.tenant = noTenantLane
	}
	l := c.lanes[key]
	if l == nil {
		l = c.newLane(key, ps, terr != nil)
	}
	l.seen = true
	l.push(m)
	l.t.queued++
	ps.queued++
	if l.parked {
		l.t.parked++
		c.parkedTotal++
	}
	if !l.running && !c.draining {
		l.running = true
		c.pushReady(l)
	}
	if !ps.paused && c.overBounds(ps, l) {
		ps.paused = true
		c.src.Pause(ps.p)
		c.mu.Unlock()
		c.emit(Event{Kind: EventPaused, Partition: ps.p, Tenant: l.t.name})
		return
	}
	c.mu.Unlock()
}

// noTenantLane is the lane key for messages without a usable tenant. It
// cannot collide with a real tenant: real keys are checked first and any
// string is a valid key, so the bucket is kept apart by the noTenant flag.
const noTenantLane = "\x00ringfence:no-tenant"

func (c *Consumer) newLane(key laneKey, ps *partState, noTenant bool) *lane {
	t := c.tenants[key.tenant]
	if t == nil {
		t = &tenantState{name: key.tenant}
		c.tenants[key.tenant] = t
	}
	t.lanes++
	l := &lane{key: key, t: t, ps: ps, noTenant: noTenant}
	c.lanes[key] = l
	ps.laneSet[l] = struct{}{}
	if len(c.lanes) > c.sweepAt {
		c.sweepIdle()
	}
	return l
}

// sweepIdle drops lanes that stayed empty and idle since the last sweep, so
// the lane map stays proportional to active tenants. Called with mu held.
func (c *Consumer) sweepIdle() {
	for _, l := range c.lanes {
		if l.len() == 0 && !l.running && !l.parked {
			if l.seen {
				l.seen = false
				continue
			}
			c.forgetLane(l)
		}
	}
	c.sweepAt = max(4096, 2*len(c.lanes))
}

// overBounds reports whether ps must be paused after l received a message.
// Called with mu held.
func (c *Consumer) overBounds(ps *partState, l *lane) bool {
	if ps.queued >= c.cfg.MaxQueuedPerPartition {
		return true
	}
	if l.parked && (l.t.parked >= c.cfg.MaxParkedPerTenant || c.parkedTotal >= c.cfg.MaxParked) {
		return true
	}
	return false
}

// maybeResume resumes paused partitions whose pressure is gone. Called with
// mu held.
func (c *Consumer) maybeResume() {
	if c.draining {
		return
	}
	var resumed []Partition
	for _, ps := range c.parts {
		if !ps.paused || ps.queued > c.cfg.MaxQueuedPerPartition/2 {
			continue
		}
		blocked := c.parkedTotal >= c.cfg.MaxParked*9/10
		if !blocked {
			for l := range ps.laneSet {
				if l.parked && l.t.parked >= c.cfg.MaxParkedPerTenant*9/10 {
					blocked = true
					break
				}
			}
		}
		if !blocked {
			ps.paused = false
			c.src.Resume(ps.p)
			resumed = append(resumed, ps.p)
		}
	}
	for _, p := range resumed {
		c.emitLocked(Event{Kind: EventResumedPartition, Partition: p})
	}
}

func (c *Consumer) pushReady(l *lane) {
	c.ready = append(c.ready, l)
	c.cond.Signal()
}

func (c *Consumer) popReady() *lane {
	l := c.ready[c.readyHead]
	c.ready[c.readyHead] = nil
	c.readyHead++
	if c.readyHead == len(c.ready) {
		c.ready = c.ready[:0]
		c.readyHead = 0
	} else if c.readyHead > 1024 && c.readyHead*2 > len(c.ready) {
		n := copy(c.ready, c.ready[c.readyHead:])
		clear(c.ready[n:])
		c.ready = c.ready[:n]
		c.readyHead = 0
	}
	return l
}

// worker takes ready lanes and runs up to a batch of their messages, so one
// busy tenant cannot starve the others.
func (c *Consumer) worker() {
	const batch = 16
	for {
		c.mu.Lock()
		for c.readyHead == len(c.ready) && !c.draining {
			c.cond.Wait()
		}
		if c.draining {
			c.mu.Unlock()
			return
		}
		l := c.popReady()
		c.mu.Unlock()
		c.runLane(l, batch)
	}
}

// runLane processes up to n messages of l. The caller owns l (l.running).
func (c *Consumer) runLane(l *lane, n int) {
	for i := 0; i < n; i++ {
		c.mu.Lock()
		if l.dead {
			c.mu.Unlock()
			return
		}
		if l.len() == 0 || c.draining {
			l.running = false
			c.mu.Unlock()
			return
		}
		m := l.front()
		judge := l.judge
		// Evidence: the head failed in a judge round that a later message
		// of its lane won. It is used only once the head is suspect again
		// (its attempts used up, or its probes failed), never to cut its
		// retries short.
		evidence := judge != "" && m.st.evidence
		c.mu.Unlock()

		next := c.step(l, m, judge, evidence)
		if next.wait > 0 {
			c.mu.Lock()
			if l.dead || c.draining {
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
			time.AfterFunc(next.wait, func() { c.wake(l) })
			return
		}
	}
	// Batch used up: back of the queue, for fairness.
	c.mu.Lock()
	if !l.dead && !c.draining {
		c.pushReady(l)
	} else if !l.dead {
		l.running = false
	}
	c.mu.Unlock()
}

// wake makes a lane ready again after its wait.
func (c *Consumer) wake(l *lane) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l.dead {
		return
	}
	if c.draining {
		l.running = false
		return
	}
	c.pushReady(l)
}

type stepResult struct {
	wait time.Duration // lane waits this long before its next step
}

// step makes one move on the lane's head message m. When the head is
// suspect (judge set), evidence says whether the tenant already succeeded
// since the head last failed.
func (c *Consumer) step(l *lane, m *Message, judge dlq.Reason, evidence bool) stepResult {
	if l.noTenant {
		reason := dlq.ReasonNoTenant
		if !errors.Is(m.st.tenantErr, ErrNoTenant) {
			reason = dlq.ReasonInvalidTenant
		}
		return c.deadLetter(l, m, reason, m.st.tenantErr)
	}
	if m.st.dlqReason != "" {
		return c.deadLetter(l, m, m.st.dlqReason, m.st.lastErr)
	}
	g := c.scope.For(l.key.tenant)
	permit, err := g.Allow(c.hctx)
	if err != nil {
		return c.park(l, g, err)
	}
	c.mu.Lock()
	resumed := l.parked && !l.dead
	if resumed {
		c.unpark(l)
	}
	c.mu.Unlock()
	if resumed {
		c.emit(Event{Kind: EventResumed, Tenant: l.key.tenant, Partition: l.key.part})
	}
	if judge != "" && (judge != dlq.ReasonPoison || permit.Probe() || evidence) {
		return c.judge(l, g, permit, m, judge, evidence)
	}
	herr, panicked := c.call(l, g, m)
	probe := permit.Probe() // Done zeroes the permit
	permit.Done(herr)
	if herr == nil {
		c.handledAt(l, m, 0)
		m.st.probeFails = 0
		return stepResult{}
	}
	c.noteFailure(l, m, herr, panicked)
	if policy.IsPermanent(herr) {
		return c.deadLetter(l, m, dlq.ReasonPermanent, herr)
	}
	if probe || g.State() != policy.Closed {
		// The breaker opened, or a probe failed: the tenant's dependency is
		// out, which is not the message's fault. Its attempts start over.
		if probe {
			m.st.probeFails++
			if m.st.probeFails >= c.cfg.PoisonProbes {
				c.suspect(l, dlq.ReasonPoison)
			}
		}
		m.st.attempts, m.st.prev = 0, 0
		return c.park(l, g, nil)
	}
	dec := g.NextRetry(m.st.attempts, herr, m.st.prev)
	d := dec.Delay
	switch {
	case dec.Retry:
	case dec.Stop == policy.StopOpen:
		// Another lane of the tenant tripped the breaker meanwhile.
		m.st.attempts, m.st.prev = 0, 0
		return c.park(l, g, nil)
	case dec.Stop == policy.StopBudget && m.st.attempts < g.MaxAttempts():
		// The tenant's budget is spent: retry, but only after the longest
		// backoff, so that the dependency is not hammered.
		d = g.Backoff(g.MaxAttempts(), herr, 1<<62)
	default:
		reason := dlq.ReasonExhausted
		if panicked {
			reason = dlq.ReasonPanic
		}
		// Suspect: the judge decides at once whether there is evidence
		// that the message, not the tenant's dependency, is at fault.
		c.suspect(l, reason)
		return stepResult{}
	}
	m.st.prev = d
	c.retried.Add(1)
	c.emit(Event{Kind: EventRetried, Tenant: l.key.tenant, Partition: l.key.part, Offset: m.Offset, Err: herr, Delay: d})
	return stepResult{wait: max(d, time.Microsecond)}
}

// handledAt settles the lane's message at idx (0: head) after its handler
// succeeded.
func (c *Consumer) handledAt(l *lane, m *Message, idx int) {
	c.handled.Add(1)
	c.settle(l.ps, m)
	c.mu.Lock()
	l.t.handled++
	c.popAt(l, idx)
	c.mu.Unlock()
	if idx == 0 {
		m.st.probeFails = 0
	}
}

// noteFailure records a failed attempt of m.
func (c *Consumer) noteFailure(l *lane, m *Message, err error, panicked bool) {
	now := time.Now()
	c.failed.Add(1)
	c.mu.Lock()
	l.t.failed++
	c.mu.Unlock()
	m.st.attempts++
	m.st.total++
	if m.st.first.IsZero() {
		m.st.first = now
	}
	m.st.last = now
	m.st.lastErr = err
	m.st.panicked = panicked
	if panicked {
		c.panics.Add(1)
		c.emit(Event{Kind: EventPanicked, Tenant: l.key.tenant, Partition: l.key.part, Offset: m.Offset, Err: err})
	}
}

// suspect marks the lane's head as suspect for reason.
func (c *Consumer) suspect(l *lane, reason dlq.Reason) {
	c.mu.Lock()
	l.judge = reason
	l.judgeSpan = max(l.judgeSpan, 1)
	c.mu.Unlock()
}

// maxJudgeSpan caps how many following messages one judge tries.
const maxJudgeSpan = 64

// judge decides whether the suspect head m fails on its own or because the
// tenant's dependency is out. A message is dead-lettered only on evidence:
// it failed again after an attempt of another message of its tenant, begun
// after its own failure, succeeded. Without evidence it waits.
//
// Under one permit, the head is tried first (unless it has just failed its
// last attempt). If it fails and there is evidence already, it is
// dead-lettered. Otherwise the following messages are tried in order, up
// to judgeSpan of them, stopping at the first success. If they all fail,
// the tenant is failing broadly (an outage): nothing moves, the head starts
// over, and the next judge may try twice as many (so a run of bad messages
// cannot stall the lane). If one succeeds, that is evidence, and the head
// gets one last attempt: failing, it is dead-lettered; succeeding, the
// outage just ended and the messages that were tried were handled before
// it, the only reordering the engine makes. The following messages that
// failed carry that evidence too and are judged next, as heads.
func (c *Consumer) judge(l *lane, g *policy.Guard, permit policy.Permit, m *Message, reason dlq.Reason, evidence bool) stepResult {
	c.mu.Lock()
	span := min(l.judgeSpan, l.len()-1)
	var next []*Message
	if span > 0 {
		next = append(next, l.q[l.head+1:l.head+1+span]...)
	}
	c.mu.Unlock()

	if reason == dlq.ReasonPoison || evidence || len(next) == 0 {
		herr, panicked := c.call(l, g, m)
		if herr == nil {
			permit.Done(nil)
			c.handledAt(l, m, 0)
			return stepResult{}
		}
		c.noteFailure(l, m, herr, panicked)
		if policy.IsPermanent(herr) {
			permit.Done(herr)
			return c.deadLetter(l, m, dlq.ReasonPermanent, herr)
		}
		if len(next) == 0 {
			permit.Done(herr)
			if evidence {
				return c.deadLetter(l, m, reason, herr)
			}
			// No evidence either way: keep the message and wait. Its
			// failures count toward the breaker, which parks the tenant if
			// its dependency is out.
			return c.wait(l, g, m, herr)
		}
		// Evidence or not, the messages behind it confirm: if they fail
		// too, the tenant is failing broadly right now.
	}
	var lastErr error
	for i, alt := range next {
		aerr, panicked := c.call(l, g, alt)
		if aerr != nil {
			c.noteFailure(l, alt, aerr, panicked)
			lastErr = aerr
			continue
		}
		// alt won: the head and the messages that failed in this round,
		// just before it, failed while the dependency worked.
		m.st.evidence = true
		for _, bad := range next[:i] {
			bad.st.evidence = true
		}
		permit.Done(nil)
		c.handledAt(l, alt, i+1)
		c.emit(Event{Kind: EventReordered, Tenant: l.key.tenant, Partition: l.key.part, Offset: alt.Offset, Reason: reason})
		last, err := g.Allow(c.hctx)
		if err != nil {
			// Refused (other lanes of the tenant are failing): the evidence
			// stays, and the next judge uses it.
			return c.park(l, g, err)
		}
		herr, panicked := c.call(l, g, m)
		last.Done(herr)
		if herr == nil {
			c.handledAt(l, m, 0)
			return stepResult{}
		}
		c.noteFailure(l, m, herr, panicked)
		return c.deadLetter(l, m, reason, herr)
	}
	permit.Done(lastErr)
	m.st.evidence = false // the tenant is failing broadly now
	for _, f := range next {
		f.st.evidence = false
	}
	c.mu.Lock()
	l.judge = "" // the head starts over; the next judge may try further
	l.judgeSpan = min(2*l.judgeSpan, maxJudgeSpan)
	c.mu.Unlock()
	return c.wait(l, g, m, lastErr)
}

// wait keeps a suspect head without evidence: its round of attempts starts
// over after a backoff that keeps growing from round to round, or after the
// breaker's open period.
func (c *Consumer) wait(l *lane, g *policy.Guard, m *Message, err error) stepResult {
	d := max(g.Backoff(g.MaxAttempts(), err, m.st.prev), time.Millisecond)
	m.st.attempts, m.st.prev = 0, d
	if g.State() != policy.Closed {
		return c.park(l, g, nil)
	}
	return stepResult{wait: d}
}

// park stops the lane until the breaker admits a probe.
func (c *Consumer) park(l *lane, g *policy.Guard, refusal error) stepResult {
	wait := g.RetryAfter()
	var oe *policy.OpenError
	if errors.As(refusal, &oe) {
		wait = oe.RetryAfter()
	} else if refusal != nil {
		wait = c.cfg.DLQRetry // admission refused: come back soon
	}
	wait = max(wait, time.Millisecond)
	c.mu.Lock()
	first := !l.parked
	if first && !l.dead {
		l.parked = true
		n := l.len()
		l.t.parked += n
		c.parkedTotal += n
		l.t.pinned++
		c.scope.Pin(l.key.tenant)
	}
	c.mu.Unlock()
	if first {
		c.emit(Event{Kind: EventParked, Tenant: l.key.tenant, Partition: l.key.part, Delay: wait, Err: refusal})
	}
	return stepResult{wait: wait}
}

// unpark is called with mu held.
func (c *Consumer) unpark(l *lane) {
	if !l.parked {
		return
	}
	c.unparkCounts(l)
	c.maybeResume()
}

func (c *Consumer) unparkCounts(l *lane) {
	n := l.len()
	l.parked = false
	l.t.parked -= n
	c.parkedTotal -= n
	l.t.pinned--
	c.scope.Unpin(l.key.tenant)
}

// popAt removes a settled message from the lane. Called with mu held.
func (c *Consumer) popAt(l *lane, idx int) {
	if l.dead {
		return
	}
	l.remove(idx)
	if idx == 0 {
		l.judge, l.judgeSpan = "", 0
	}
	l.t.queued--
	l.ps.queued--
	if l.parked {
		l.t.parked--
		c.parkedTotal--
	}
	if l.ps.paused {
		c.maybeResume()
	}
}

// call runs the handler, turning a panic into an error.
func (c *Consumer) call(l *lane, g *policy.Guard, m *Message) (err error, panicked bool) {
	c.inflight.Add(1)
	defer c.inflight.Add(-1)
	ctx := c.hctx
	if d := g.Deadline(); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	defer func() {
		if r := recover(); r != nil {
			buf := make([]byte, 2048)
			buf = buf[:runtime.Stack(buf, false)]
			err = &PanicError{Value: r, Stack: string(buf)}
			panicked = true
		}
	}()
	return c.cfg.Handler.Handle(ctx, m), false
}

// PanicError is the failure recorded when a handler panics.
type PanicError struct {
	Value any
	Stack string
}

func (e *PanicError) Error() string { return fmt.Sprintf("consumer: handler panic: %v", e.Value) }

// deadLetter writes m to its tenant's DLQ and settles it; while the DLQ
// fails, m stays unsettled at the head of its lane and the write is retried.
func (c *Consumer) deadLetter(l *lane, m *Message, reason dlq.Reason, cause error) stepResult {
	rec := c.record(l, m, reason, cause)
	if err := c.cfg.DLQ.Write(c.hctx, rec); err != nil {
		m.st.dlqReason = reason
		m.st.dlqFails++
		wait := c.cfg.DLQRetry << min(m.st.dlqFails-1, 8)
		wait = min(wait, 30*time.Second)
		c.log.Warn("consumer: dead-letter write failed; message kept unsettled", "tenant", l.key.tenant, "offset", m.Offset, "err", err, "retry_in", wait)
		c.emit(Event{Kind: EventDLQFailed, Tenant: l.t.name, Partition: l.key.part, Offset: m.Offset, Err: err, Reason: reason, Delay: wait})
		return stepResult{wait: wait}
	}
	c.dead.Add(1)
	c.settle(l.ps, m)
	c.mu.Lock()
	l.t.dead++
	c.popAt(l, 0)
	c.mu.Unlock()
	c.emit(Event{Kind: EventDeadLettered, Tenant: l.t.name, Partition: l.key.part, Offset: m.Offset, Err: cause, Reason: reason})
	return stepResult{}
}

func (c *Consumer) record(l *lane, m *Message, reason dlq.Reason, cause error) *dlq.Record {
	rec := &dlq.Record{
		Key:          m.Key,
		Value:        m.Value,
		Headers:      m.Headers,
		Source:       m.Topic,
		Partition:    m.Partition.ID,
		Offset:       m.Offset,
		Group:        c.cfg.Group,
		Attempts:     m.st.total,
		FirstFailure: m.st.first,
		LastFailure:  m.st.last,
		Reason:       reason,
	}
	if !l.noTenant {
		rec.Tenant = l.key.tenant
	}
	if rec.FirstFailure.IsZero() {
		now := time.Now()
		rec.FirstFailure, rec.LastFailure = now, now
	}
	if cause != nil {
		rec.Error, rec.ErrorType = dlq.CapError(cause)
	}
	rec.Redrive = dlq.RedriveCount(m.Headers)
	if m.Stream != "" {
		rec.Stream, rec.Sequence = m.Stream, uint64(m.Offset)
		rec.Offset = -1
	}
	return rec
}

// settle reports m settled to the source and advances its partition's
// watermark. ps is the partition state m was delivered under.
func (c *Consumer) settle(ps *partState, m *Message) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if !ps.live || m.gen != ps.gen {
		return
	}
	if err := c.src.Settle(c.hctx, m); err != nil {
		c.log.Warn("consumer: settle failed; the message may be redelivered", "partition", m.Partition, "offset", m.Offset, "err", err)
	}
	if next, ok := ps.wm.settle(m.seq); ok {
		if err := c.src.Commit(c.hctx, ps.p, next); err != nil {
			c.log.Warn("consumer: commit failed", "partition", ps.p, "next", next, "err", err)
		}
	}
}

// msgState is the engine's bookkeeping for one message.
type msgState struct {
	tenantErr  error
	attempts   int // attempts in the current round
	total      int // attempts in all
	prev       time.Duration
	first      time.Time
	last       time.Time
	lastErr    error
	panicked   bool
	probeFails int
	evidence   bool // failed in a judge round that a later message won
	dlqReason  dlq.Reason
	dlqFails   int
}

// TenantStats is a snapshot of one tenant.
type TenantStats struct {
	Tenant       string
	Handled      uint64
	Failed       uint64
	DeadLettered uint64
	// Parked is how many of its messages wait behind an open breaker now.
	Parked int
	// Queued is how many of its messages are in the engine now (parked
	// ones included).
	Queued int
	State  policy.State
}

// Stats is a snapshot of the engine.
type Stats struct {
	Handled, Failed, DeadLettered, Retried, Panics uint64
	Parked, Queued, InFlight                       int
	PausedPartitions                               int
	// Tenants lists the tenants the engine tracks now, sorted by key.
	// Tenants idle for long may be dropped from it; totals above stay.
	Tenants []TenantStats
}

// Stats returns a snapshot of the engine and its tenants.
func (c *Consumer) Stats() Stats {
	s := Stats{
		Handled:      c.handled.Load(),
		Failed:       c.failed.Load(),
		DeadLettered: c.dead.Load(),
		Retried:      c.retried.Load(),
		Panics:       c.panics.Load(),
		InFlight:     int(c.inflight.Load()),
	}
	c.mu.Lock()
	s.Parked = c.parkedTotal
	for _, ps := range c.parts {
		s.Queued += ps.queued
		if ps.paused {
			s.PausedPartitions++
		}
	}
	for _, t := range c.tenants {
		ts := TenantStats{Tenant: t.name, Handled: t.handled, Failed: t.failed, DeadLettered: t.dead, Parked: t.parked, Queued: t.queued}
		if t.name == noTenantLane {
			ts.Tenant = ""
		}
		s.Tenants = append(s.Tenants, ts)
	}
	c.mu.Unlock()
	for i := range s.Tenants {
		s.Tenants[i].State = c.state(s.Tenants[i].Tenant)
	}
	sort.Slice(s.Tenants, func(i, j int) bool { return s.Tenants[i].Tenant < s.Tenants[j].Tenant })
	return s
}

// Tenant returns the snapshot of one tenant, if the engine tracks it.
func (c *Consumer) Tenant(key string) (TenantStats, bool) {
	c.mu.Lock()
	t := c.tenants[key]
	if t == nil {
		c.mu.Unlock()
		return TenantStats{}, false
	}
	ts := TenantStats{Tenant: t.name, Handled: t.handled, Failed: t.failed, DeadLettered: t.dead, Parked: t.parked, Queued: t.queued}
	c.mu.Unlock()
	ts.State = c.state(key)
	return ts, true
}

// state is the tenant's breaker state, without creating (or keeping alive)
// a guard just to report it: a tenant without a guard is closed.
func (c *Consumer) state(tenant string) policy.State {
	if g, ok := c.scope.Peek(tenant); ok && tenant != "" {
		return g.State()
	}
	return policy.Closed
}

package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
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

// roundWorld is the shared state of one round: the handler's view of the
// faults and its record of successes.
type roundWorld struct {
	rp     *roundPlan
	outage []atomic.Bool
	calls  []atomic.Int32 // per message id

	offsets   [][]int // ids by partition and offset; written by the driver only
	letters   int     // dead letters at the end; set by checkRound
	forgotten int     // tenants the last engine forgot (Stats.Tracked)

	mu        sync.Mutex
	reordered map[[2]int64]bool // partition, offset of each EventReordered
	aheads    int               // read-ahead pauses (EventPaused, PauseReadAhead)
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
		ReadAhead:             rp.readAhead,
		MaxIdleTenants:        rp.maxIdle,
		DrainTimeout:          2 * time.Second,
		DLQRetry:              time.Millisecond,
		Logger:                slog.New(slog.DiscardHandler),
		OnEvent: func(ev consumer.Event) {
			switch {
			case ev.Kind == consumer.EventReordered:
				w.mu.Lock()
				w.reordered[[2]int64{int64(ev.Partition.ID), ev.Offset}] = true
				w.mu.Unlock()
			case ev.Kind == consumer.EventPaused && ev.Pause == consumer.PauseReadAhead:
				w.mu.Lock()
				w.aheads++
				w.mu.Unlock()
			}
			w.tracef("event %v tenant %s p%d off %d reason %q pause %v delay %v err %v", ev.Kind, ev.Tenant, ev.Partition.ID, ev.Offset, ev.Reason, ev.Pause, ev.Delay, ev.Err)
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
		// The engine's goroutines, to see where the drain is stuck.
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var stuck []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "ringfence/consumer.") && !strings.Contains(g, "consumer_test.") {
				stuck = append(stuck, g)
			}
		}
		return fmt.Errorf("Run did not return within 10s of cancel; engine goroutines:\n%s", strings.Join(stuck, "\n\n"))
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
	var msgs, letters, reordered, again, redelivering, aheads, forgotten int
	for _, seed := range seeds {
		rp := newRoundPlan(seed)
		problems, w := runRound(t, rp)
		msgs += len(rp.msgs)
		letters += w.letters
		forgotten += w.forgotten
		reordered += len(w.reordered)
		w.mu.Lock()
		aheads += w.aheads
		w.mu.Unlock()
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
	t.Logf("%d rounds, %d messages: %d dead letters, %d handled ahead of a suspect head, %d handled again after a redelivery (%d rounds with a rebalance or restart), %d read-ahead pauses, %d tenants forgotten",
		len(seeds), msgs, letters, reordered, again, redelivering, aheads, forgotten)
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
	controls := map[string]consumer.Control{} // the operators' table, kept across a restart
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
			e.c.SetControls(controls)
		case faultControlOn:
			controls[tenantName(f.tenant)] = consumer.Control{Hold: !f.quarantine, Quarantine: f.quarantine}
			e.c.SetControls(controls)
			w.tracef("control on %s (quarantine %v)", tenantName(f.tenant), f.quarantine)
		case faultControlOff:
			delete(controls, tenantName(f.tenant))
			e.c.SetControls(controls)
			w.tracef("control off %s", tenantName(f.tenant))
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
	// Every fault is over: no outage, no control, the DLQ works, everything
	// produced.
	e.c.SetControls(nil)
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
		if !within(10*time.Second, idle) {
			s := e.c.Stats()
			fail("stats after the drain: queued %d parked %d inflight %d paused partitions %d, lanes %v", s.Queued, s.Parked, s.InFlight, s.PausedPartitions, consumer.DumpLanes(e.c))
		}
		if n := h.Sp.Backlog(); rp.spill && !within(10*time.Second, func() bool { return h.Sp.Backlog() == 0 }) {
			fail("spill logs hold %d uncommitted entries after the drain", n)
		}
	}
	if err := consumer.CheckInvariants(e.c); err != nil {
		fail("invariants after the drain: %v", err)
	}
	w.forgotten = int(e.c.Stats().Tracked.Forgotten)
	if err := e.stop(); err != nil {
		fail("final stop: %v", err)
	}

	problems = append(problems, checkRound(h, rp, w, ends)...)
	if n := settleGoroutines(before); n > before+2 {
		fail("goroutine leak: %d before the round, %d after Run returned", before, n)
	}
	return problems, w
}

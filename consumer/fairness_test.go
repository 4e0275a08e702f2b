package consumer_test

// Scheduling: fair turns between a partition's tenants, per-tenant
// bulkheads, and how workers are woken and rescued.

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// One tenant holds a backlog of 2,000 messages in the engine and 255
// tenants send one message each, behind it on the same partition. Workers
// take lanes in turns, not in arrival order: the hot tenant's lane runs one
// turn and goes back behind the quiet lanes, so the hot tenant makes at most
// one turn of calls (longestTurn) before the last quiet tenant's call, for
// each kind of turn and with one worker or several. In arrival order it
// would make all 2,000 first.
//
// The engine's order alone decides the outcome. The guards' clock is the
// test's and only the hot tenant's calls move it, by exactly call each, so
// its estimate (and so its turn) is known. After a warm-up that gives the
// hot tenant its estimate, every call waits in the handler until the test
// lets it go (heldCalls): one gate tenant's call per worker holds the
// workers until the backlog and the quiet tenants are in the engine; then
// the test lets the oldest call go, one at a time, and the one worker that
// frees makes the next call, which is the engine's choice.
func TestFairSchedulingQuietTenantsPassAHotBacklog(t *testing.T) {
	for _, workers := range []int{1, 4} {
		for _, kind := range turnKinds {
			t.Run(fmt.Sprintf("workers=%d/%s", workers, kind.name), func(t *testing.T) {
				testQuietTenantsPassAHotBacklog(t, workers, kind.call)
			})
		}
	}
}

func testQuietTenantsPassAHotBacklog(t *testing.T, workers int, call time.Duration) {
	const warm, backlog, quiet = 64, 2000, 255 // warm: genSource's batch
	n := warm + workers + backlog + quiet
	clk := &stepClock{}
	var engine engineRef
	var warmed atomic.Int64
	src := newGenSource(n, func(i int) *consumer.Message {
		switch {
		case i < warm:
			return tenantMsg("hot", "warm")
		case i == warm:
			// The first of a batch: every warm-up message was delivered.
			engine.waitIdle(func() bool { return warmed.Load() == warm })
		}
		switch i -= warm; {
		case i < workers:
			return tenantMsg(fmt.Sprintf("gate-%d", i), "held")
		case i < workers+backlog:
			return tenantMsg("hot", "held")
		}
		return tenantMsg(fmt.Sprintf("quiet-%03d", i-workers-backlog), "held")
	})
	calls := newHeldCalls(n)
	c := startWith(t, consumer.Config{
		Scope:                 scope.New(policy.Policy{Clock: clk}, scope.Options[string]{}),
		Concurrency:           workers,
		MaxQueuedPerPartition: 2 * n,
		MaxQueuedPerTenant:    2 * n, // the backlog stays in memory (no spill log here)
		ReadAhead:             2 * n, // off: a quick tenant's backlog too
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == "held" {
				calls.hold(string(m.Key))
			}
			if string(m.Key) == "hot" {
				clk.advance(call)
			}
			if string(m.Value) == "warm" {
				warmed.Add(1)
			}
			return nil
		}),
	}, src)
	engine.Store(c)
	t.Cleanup(calls.releaseAll) // before startWith's: Run's drain waits for the calls

	inFlight := make([]heldCall, 0, workers)
	for range workers {
		hc := calls.next(t)
		if !strings.HasPrefix(hc.tenant, "gate-") {
			t.Fatalf("%s's call began while the gates' were expected", hc.tenant)
		}
		inFlight = append(inFlight, hc)
	}
	consumertest.Eventually(t, "the backlog and the quiet tenants in the engine", func() bool {
		return c.Stats().Queued == workers+backlog+quiet
	})
	hot := 0
	for left := quiet; left > 0; {
		close(inFlight[0].release)
		hc := calls.next(t)
		inFlight = append(inFlight[1:], hc)
		switch {
		case hc.tenant == "hot":
			hot++
		case strings.HasPrefix(hc.tenant, "quiet-"):
			left--
		default:
			t.Fatalf("a call of %s after the gates", hc.tenant)
		}
	}
	calls.releaseAll()
	turn := longestTurn(call)
	t.Logf("the hot tenant made %d calls before the last quiet tenant's (a turn: at most %d)", hot, turn)
	if hot > turn {
		t.Fatalf("the hot tenant made %d calls before the last of %d quiet tenants behind its backlog made one; a turn of its calls (%v each on the guards' clock) is at most %d", hot, quiet, call, turn)
	}
	if hot == 0 {
		t.Fatal("the hot tenant made no call before the quiet tenants': its lane was not ahead of theirs, and the test raced nothing")
	}
	consumertest.Eventually(t, "every message handled", func() bool { return c.Stats().Handled == uint64(n) })
}

// turnKinds are the kinds of turn of the package doc's scheduling rule
// (see creditOf), by how long a tenant's calls take on the guards' clock:
// no time (an estimate of 1ns: quick, a turn of up to RunMax), well under
// SlowTurn (as many calls as fit into it, up to ShardTurn), and over half
// of SlowTurn (one call a turn, the tenant's weight).
var turnKinds = []struct {
	name string
	call time.Duration
}{
	{"quick", 0},
	{"under-slow-turn", 50 * time.Microsecond},
	{"slow", 2 * time.Millisecond},
}

// longestTurn is the most messages a lane of weight 1 whose calls take call
// (one of turnKinds') runs in one turn while another lane of its partition
// is ready.
func longestTurn(call time.Duration) int {
	switch {
	case call == 0:
		return consumer.RunMax
	case call < consumer.SlowTurn/2:
		return min(int(consumer.SlowTurn/call), consumer.ShardTurn)
	}
	return 1
}

// heldCalls holds handler calls until the test lets them go, so that the
// test, not the machine's speed, decides which calls are in flight: with
// every worker in a held call, letting one go frees one worker, and the
// call it makes next is the engine's choice.
type heldCalls struct {
	entered chan heldCall // every held call, as it begins
	free    chan struct{} // closed by releaseAll: every call goes on
	once    sync.Once
}

// heldCall is one call waiting in the handler until release is closed.
type heldCall struct {
	tenant  string
	release chan struct{}
}

// newHeldCalls holds up to n calls.
func newHeldCalls(n int) *heldCalls {
	return &heldCalls{entered: make(chan heldCall, n), free: make(chan struct{})}
}

// hold is called by the handler: it waits until the test lets the call go.
func (h *heldCalls) hold(tenant string) {
	c := heldCall{tenant: tenant, release: make(chan struct{})}
	h.entered <- c
	select {
	case <-c.release:
	case <-h.free:
	}
}

// next returns the next call to begin; it fails t after WaitTimeout.
func (h *heldCalls) next(t *testing.T) heldCall {
	t.Helper()
	select {
	case c := <-h.entered:
		return c
	case <-time.After(consumertest.WaitTimeout):
		t.Fatalf("no handler call began within %v", consumertest.WaitTimeout)
		return heldCall{}
	}
}

// releaseAll lets every call, held or to come, go on.
func (h *heldCalls) releaseAll() { h.once.Do(func() { close(h.free) }) }

// engineRef is the engine a generating source's gen waits for: gen runs in
// the source's Run, which starts before startWith returns the engine.
type engineRef struct {
	atomic.Pointer[consumer.Consumer]
}

// waitIdle blocks until the engine is set, done holds and the engine holds
// no message (every lane idle), or for WaitTimeout at most: a gen that
// returns its next message only then delivers it to an idle engine.
func (r *engineRef) waitIdle(done func() bool) {
	within(consumertest.WaitTimeout, func() bool {
		c := r.Load()
		return c != nil && done() && c.Stats().Queued == 0
	})
}

// Per-tenant bulkhead: a tenant whose calls hang, with a lane on each of
// 8 partitions and Concurrency 8, holds at most its TenantConcurrency of
// workers; another tenant's message is handled while the slow tenant's
// calls are still blocked.
func TestBulkheadKeepsWorkersForOthers(t *testing.T) {
	const parts = 8
	h := consumertest.NewMemHarness(parts)
	for p := range parts {
		for i := range 4 {
			h.Produce(t, consumertest.Msg{Tenant: "slow", Partition: p, Value: []byte(fmt.Sprintf("slow-%d-%d", p, i))})
		}
	}
	release := make(chan struct{})
	var slowIn, slowMost atomic.Int64
	var quick atomic.Bool
	c := startWith(t, harnessConfig(h, parts, func(ctx context.Context, m *consumer.Message) error {
		if v, _ := m.Header(consumertest.TenantHeader); string(v) == "slow" {
			n := slowIn.Add(1)
			for {
				most := slowMost.Load()
				if n <= most || slowMost.CompareAndSwap(most, n) {
					break
				}
			}
			<-release
			slowIn.Add(-1)
			return nil
		}
		quick.Store(true)
		return nil
	}), h.NewSource(t))
	consumertest.Eventually(t, "the slow tenant at its bulkhead", func() bool { return slowIn.Load() == 2 })
	h.Produce(t, consumertest.Msg{Tenant: "quick", Partition: 3, Value: []byte("quick")})
	consumertest.Eventually(t, "the quick tenant handled while the slow one hangs", quick.Load)
	ts, _ := c.Tenant("slow")
	if ts.InFlight != 2 || ts.Limit != 2 || slowMost.Load() != 2 {
		t.Fatalf("slow tenant: in flight %d, limit %d, most at once %d; want 2 (Concurrency/4)", ts.InFlight, ts.Limit, slowMost.Load())
	}
	close(release)
	consumertest.Eventually(t, "the slow tenant handled", func() bool {
		ts, _ := c.Tenant("slow")
		return ts.Handled == parts*4
	})
	if slowMost.Load() > 2 {
		t.Fatalf("the slow tenant had %d messages in flight at once, its bulkhead is 2", slowMost.Load())
	}
}

// Adaptive per-tenant concurrency: with Bulkhead.Adaptive the tenant's
// limit moves with its measured latency, below the engine's cap: it falls
// when the tenant's calls turn slower, so a dependency in trouble gets
// fewer concurrent calls from that tenant, and rises again once they are
// fast. The guards' clock is the test's and every call is a sample
// (SampleEvery 1): calls of no time on it, then calls of 40ms, then of no
// time again. Each phase's calls all end before the limit is read, so the
// limits follow from the calls alone, not from how long the machine takes
// over them.
func TestAdaptiveTenantLimitFollowsLatency(t *testing.T) {
	const parts = 8
	h := consumertest.NewMemHarness(parts)
	clk := &stepClock{}
	var slow atomic.Bool
	p := policy.Policy{Clock: clk, Bulkhead: policy.Bulkhead{Adaptive: true}, Latency: policy.Latency{SampleEvery: 1}}
	c := startWith(t, consumer.Config{
		Scope:             scope.New(p, scope.Options[string]{}),
		Tenant:            h.Tenant(),
		DLQ:               h.S,
		Concurrency:       parts,
		TenantConcurrency: parts,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if slow.Load() {
				clk.advance(40 * time.Millisecond) // the dependency's latency
			}
			return nil
		}),
	}, h.NewSource(t))
	produced := 0
	phase := func(what string, n int) int {
		t.Helper()
		for range n {
			h.Produce(t, consumertest.Msg{Tenant: "a", Partition: produced % parts, Value: []byte(fmt.Sprint(produced))})
			produced++
		}
		consumertest.Eventually(t, what, func() bool { ts, _ := c.Tenant("a"); return ts.Handled == uint64(produced) })
		ts, _ := c.Tenant("a")
		return ts.Limit
	}
	fast := phase("the fast calls handled", 800)
	if fast != parts {
		t.Fatalf("the limit is %d with calls of no time, want the cap %d", fast, parts)
	}
	slow.Store(true)
	low := phase("the slow calls handled", 200)
	if low >= parts/2 || low >= fast {
		t.Fatalf("the limit did not fall: %d with fast calls, %d with slow ones; want below %d", fast, low, parts/2)
	}
	slow.Store(false)
	again := phase("the fast calls handled again", 800)
	if again <= low {
		t.Fatalf("the limit did not rise again once the tenant was fast: %d, as with slow calls", again)
	}
	t.Logf("limit (cap %d): %d with calls of no time, %d with 40ms calls, %d after recovery", parts, fast, low, again)
}

// Waking workers: the engine wakes an idle worker for a ready
// lane only while no other woken worker is still looking for one, and a
// worker that takes a lane wakes the next while lanes are ready. Every
// ready lane still gets a worker when the ones taken before it hang: with
// Concurrency 8, seven tenants on seven partitions block in their handlers
// and an eighth, on its own partition, is handled while they all hang.
// Each round starts the engine with all eight messages already in the
// broker, so the partitions deliver at once in varying orders.
func TestEveryReadyLaneGetsAWorkerWhileOthersHang(t *testing.T) {
	const parts = 8
	for round := range 20 {
		h := consumertest.NewMemHarness(parts)
		for p := range parts - 1 {
			h.Produce(t, consumertest.Msg{Tenant: fmt.Sprintf("hang-%d", p), Partition: p, Value: []byte("hang")})
		}
		h.Produce(t, consumertest.Msg{Tenant: "quick", Partition: parts - 1, Value: []byte("quick")})
		release := make(chan struct{})
		var hanging atomic.Int64
		var quick atomic.Bool
		cfg := harnessConfig(h, parts, func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == "quick" {
				quick.Store(true)
				return nil
			}
			hanging.Add(1)
			<-release
			return nil
		})
		cfg.TenantConcurrency = 1
		c := startWith(t, cfg, h.NewSource(t))
		consumertest.Eventually(t, fmt.Sprintf("round %d: the quick tenant handled while the others hang", round), quick.Load)
		consumertest.Eventually(t, fmt.Sprintf("round %d: every hanging tenant in its handler", round), func() bool { return hanging.Load() == parts-1 })
		close(release)
		consumertest.Eventually(t, fmt.Sprintf("round %d: all handled", round), func() bool { return c.Stats().Handled == parts })
	}
}

// harnessConfig is an engine over a MemHarness: its tenants, its DLQ, a
// default policy per tenant and concurrency workers.
func harnessConfig(h *consumertest.MemHarness, concurrency int, handler consumer.HandlerFunc) consumer.Config {
	return consumer.Config{
		Scope:       scope.New(policy.Policy{}, scope.Options[string]{}),
		Tenant:      h.Tenant(),
		DLQ:         h.S,
		Concurrency: concurrency,
		Handler:     handler,
	}
}

// Turns of quick tenants: two tenants with backlogs on one
// partition and one worker. A tenant whose calls take no time takes several
// messages in a turn (up to RunMax), so that one take and one finish serve
// them, and never more than RunMax while the other waits. A tenant whose
// calls are not quick but well under SlowTurn (here 50µs each by the
// policy's clock) takes as many as fit into SlowTurn, at most ShardTurn: a
// turn of several calls, not one. A tenant whose calls take longer than
// half of SlowTurn (here 2ms) takes one message a turn, its weight: the two
// alternate. The policy's clock is the test's, so that the estimates do not
// depend on the machine's load. The tenants' estimates warm up first; once
// those messages are handled, a third tenant's call holds the one worker
// until both backlogs are in the engine.
func TestQuickTenantsTakeLongerTurns(t *testing.T) {
	for _, tc := range []struct {
		name         string
		warm, behind int // warm: a multiple of genSource's batch of 64
		call         time.Duration
	}{
		{"quick", 2 * 64, 2000, 0},
		{"under-slow-turn", 2 * 64, 400, 50 * time.Microsecond},
		{"slow", 2 * 64, 400, 2 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &stepClock{}
			p := policy.Default()
			p.Clock = clk
			n := tc.warm + 1 + tc.behind
			var warmed atomic.Int64
			var engine engineRef
			src := newGenSource(n, func(i int) *consumer.Message {
				switch {
				case i < tc.warm:
					return tenantMsg([]string{"a", "b"}[i%2], "warm")
				case i == tc.warm:
					// The first of a batch: every warm-up message was
					// delivered. Wait until they are handled.
					engine.waitIdle(func() bool { return warmed.Load() == int64(tc.warm) })
					return tenantMsg("gate", "gate")
				}
				return tenantMsg([]string{"a", "b"}[i%2], "behind")
			})
			gate := make(chan struct{})
			var mu sync.Mutex
			var order []byte // tenants of the backlog's messages, as handled
			c := startWith(t, consumer.Config{
				Scope:                 scope.New(p, scope.Options[string]{}),
				Concurrency:           1,
				MaxQueuedPerPartition: 2 * n,
				MaxQueuedPerTenant:    2 * n,
				Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
					switch string(m.Value) {
					case "gate":
						<-gate
						return nil
					case "warm":
						warmed.Add(1)
					case "behind":
						mu.Lock()
						order = append(order, m.Key[0])
						mu.Unlock()
					}
					clk.advance(tc.call)
					return nil
				}),
			}, src)
			engine.Store(c)
			consumertest.Eventually(t, "the backlog in the engine behind the gate", func() bool {
				return warmed.Load() == int64(tc.warm) && c.Stats().Queued == tc.behind+1
			})
			close(gate)
			consumertest.Eventually(t, "the backlog handled", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(order) == tc.behind
			})
			mu.Lock()
			defer mu.Unlock()
			// The longest run of one tenant while the other still had
			// messages (the last run is left out).
			last := len(order)
			for last > 0 && order[last-1] == order[len(order)-1] {
				last--
			}
			longest, run := 0, 0
			for i := range last {
				if i > 0 && order[i] == order[i-1] {
					run++
				} else {
					run = 1
				}
				longest = max(longest, run)
			}
			t.Logf("longest turn: %d messages", longest)
			fit := int(consumer.SlowTurn / max(tc.call, 1))
			switch {
			case tc.call > consumer.SlowTurn/2 && longest != 1:
				t.Fatalf("a tenant of %v calls took %d messages in a turn while the other waited; want 1 (its weight)", tc.call, longest)
			case tc.call > 0 && tc.call <= consumer.SlowTurn/2 && (longest < 2 || longest > min(fit, consumer.ShardTurn)):
				t.Fatalf("a tenant of %v calls took %d messages in a turn while the other waited; want 2 to %d (as many as fit into %v)", tc.call, longest, min(fit, consumer.ShardTurn), consumer.SlowTurn)
			case tc.call == 0 && longest < 2:
				t.Fatalf("quick tenants alternated message by message; want turns of several")
			case longest > consumer.RunMax:
				t.Fatalf("a turn of %d messages while the other tenant waited; want at most %d", longest, consumer.RunMax)
			}
		})
	}
}

// Workers on a partition's quick lanes wake no other once there are as
// many as cores (see runQuick), and a worker that finds enough of them on
// a partition waits instead of taking its lanes. If the calls of those
// workers all hang (a quick tenant's dependency stops answering), the
// partition's other tenants must still flow: housekeeping sees the
// partition take no lane for a tick and wakes a worker that takes them.
// More tenants hang here than that count allows; every other tenant's
// messages are handled while they still hang.
func TestQuickTenantsThatHangHoldNoOneElse(t *testing.T) {
	hangers := runtime.GOMAXPROCS(0) + 1
	const others, warm, after = 8, 3000, 2000
	release := make(chan struct{})
	var releaseOnce sync.Once
	tenants := others + hangers
	n := warm + hangers + after
	src := newGenSource(n, func(i int) *consumer.Message {
		switch {
		case i < warm: // every tenant, quick calls: their estimates become quick
			return tenantMsg(fmt.Sprintf("t%d", i%tenants), "ok")
		case i < warm+hangers: // then each hanger's next call hangs
			return tenantMsg(fmt.Sprintf("t%d", others+i-warm), "hang")
		default: // and the others go on
			return tenantMsg(fmt.Sprintf("t%d", (i-warm-hangers)%others), "ok")
		}
	})
	var handled, hanging atomic.Int64
	c := startWith(t, consumer.Config{
		Concurrency:       4 * hangers,
		TenantConcurrency: 1,
		// Every call takes no time by the guards' clock: every tenant is
		// quick, whatever the machine's load.
		Scope: scope.New(policy.Policy{Clock: &stepClock{}}, scope.Options[string]{}),
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == "hang" {
				hanging.Add(1)
				<-release // ignores ctx: a call that really hangs
				return nil
			}
			handled.Add(1)
			return nil
		}),
	}, src)
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before startWith's: Run's drain waits for the calls
	consumertest.Eventually(t, "every hanger's call to hang", func() bool { return hanging.Load() == int64(hangers) })
	consumertest.Eventually(t, "the other tenants' messages handled while the hangers hang", func() bool {
		return handled.Load() == int64(warm+after)
	})
	if got := hanging.Load(); got != int64(hangers) {
		t.Fatalf("%d calls hanging, want %d", got, hangers)
	}
	// Without the rescue the other tenants would wait for the hangers: the
	// partition had to be rescued, and Stats says so.
	if ps := c.Stats().Partitions; len(ps) != 1 || ps[0].Rescues == 0 {
		t.Fatalf("partition stats %+v: want one partition, rescued at least once", ps)
	}
	releaseOnce.Do(func() { close(release) })
	consumertest.Eventually(t, "everything committed", func() bool { return src.commits.Load() == int64(n) })
}

package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// Fair scheduling (issue 17): one tenant holds a backlog of 100,000
// messages in the engine and 99 tenants send one message each, behind it on
// the same partition. Workers take lanes in turns, not in arrival order, so
// every one of the 99 is handled within the first 99 + Concurrency handler
// calls.
func TestFairSchedulingQuietTenantsPassAHotBacklog(t *testing.T) {
	const hot, quiet, concurrency = 100_000, 99, 8
	n := hot + quiet
	src := newGenSource(n, func(i int) *consumer.Message {
		if i < hot {
			return tenantMsg("hot", "h")
		}
		return tenantMsg(fmt.Sprintf("quiet-%02d", i-hot), "q")
	})
	gate := make(chan struct{})
	var calls atomic.Int64
	var mu sync.Mutex
	quietAt := map[string]int64{}
	c := startWith(t, consumer.Config{
		Concurrency:           concurrency,
		MaxQueuedPerPartition: 2 * n,
		MaxQueuedPerTenant:    2 * n, // the backlog stays in memory (no spill log here)
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			// Counted as the call starts (the order the engine dispatched
			// in). Each call waits a little, as a call to a dependency
			// does: with no-op handlers that never block, which worker
			// runs next on two cores is up to the Go scheduler's 10ms time
			// slices (thousands of calls), not the engine's order.
			k := calls.Add(1)
			<-gate
			time.Sleep(20 * time.Microsecond)
			if string(m.Value) == "q" {
				mu.Lock()
				quietAt[string(m.Key)] = k
				mu.Unlock()
			}
			return nil
		}),
	}, src)
	consumertest.Eventually(t, "every message in the engine", func() bool { return c.Stats().Queued == n })
	close(gate)
	consumertest.Eventually(t, "the quiet tenants handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(quietAt) == quiet
	})
	var worst int64
	mu.Lock()
	for _, k := range quietAt {
		worst = max(worst, k)
	}
	mu.Unlock()
	t.Logf("the last of %d quiet tenants was handled at call %d (bound %d)", quiet, worst, quiet+concurrency)
	if worst > quiet+concurrency {
		t.Fatalf("a quiet tenant waited until handler call %d behind a hot backlog; fair turns give %d", worst, quiet+concurrency)
	}
}

// Per-tenant bulkhead (issue 17): a tenant whose calls hang, with a lane on
// each of 8 partitions and Concurrency 8, holds at most its
// TenantConcurrency of workers; another tenant's message is handled while
// the slow tenant's calls are still blocked.
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
	_ = time.Second
}

// Adaptive per-tenant concurrency (issue 17): with Bulkhead.Adaptive the
// tenant's limit moves with its measured latency, below the engine's cap:
// it falls when the tenant's calls turn several times slower, so a
// dependency in trouble gets fewer concurrent calls from that tenant.
func TestAdaptiveTenantLimitFollowsLatency(t *testing.T) {
	const parts = 8
	h := consumertest.NewMemHarness(parts)
	var slow atomic.Bool
	p := policy.Policy{Bulkhead: policy.Bulkhead{Adaptive: true}}
	c := startWith(t, consumer.Config{
		Scope:             scope.New(p, scope.Options[string]{}),
		Tenant:            h.Tenant(),
		DLQ:               h.S,
		Concurrency:       parts,
		TenantConcurrency: parts,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			d := 2 * time.Millisecond
			if slow.Load() {
				d = 40 * time.Millisecond
			}
			time.Sleep(d) // the dependency's latency
			return nil
		}),
	}, h.NewSource(t))
	produce := func(n int) {
		for i := range n {
			h.Produce(t, consumertest.Msg{Tenant: "a", Partition: i % parts, Value: []byte(fmt.Sprint(i))})
		}
	}
	limit := func() int { ts, _ := c.Tenant("a"); return ts.Limit }
	produce(800)
	consumertest.Eventually(t, "the fast calls handled", func() bool { ts, _ := c.Tenant("a"); return ts.Handled == 800 })
	fast := limit()
	slow.Store(true)
	produce(1000)
	consumertest.Eventually(t, "the limit down once the tenant is 100x slower", func() bool { return limit() < parts/2 })
	low := limit()
	if low >= fast {
		t.Fatalf("the limit did not fall: %d with fast calls, %d with slow ones", fast, low)
	}
	slow.Store(false)
	produce(3000)
	consumertest.Eventually(t, "the limit up again once the tenant is fast", func() bool { return limit() > low })
	t.Logf("limit (cap %d): %d with 2ms calls, %d with 40ms calls, %d after recovery", parts, fast, low, limit())
}

// Waking workers (issue 18): the engine wakes an idle worker for a ready
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

// stepClock is a policy.Clock that moves only when told to: the guards'
// latency estimates then read exactly the durations a test gives its calls.
type stepClock struct{ ns atomic.Int64 }

func (c *stepClock) Now() time.Time {
	return time.Unix(1_800_000_000, 0).Add(time.Duration(c.ns.Load()))
}

func (c *stepClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// Turns of quick tenants (issue 18): two tenants with backlogs on one
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
			src := newGenSource(n, func(i int) *consumer.Message {
				switch {
				case i < tc.warm:
					return tenantMsg([]string{"a", "b"}[i%2], "warm")
				case i == tc.warm:
					// The first of a batch: every warm-up message was
					// delivered. Wait (bounded) until they are handled.
					for end := time.Now().Add(10 * time.Second); warmed.Load() < int64(tc.warm) && time.Now().Before(end); {
						time.Sleep(time.Millisecond)
					}
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

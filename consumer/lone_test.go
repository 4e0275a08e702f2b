package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
)

// loneRun starts an engine (MaxIdleTenants 2, 4 workers) whose handler
// waits for open to be closed, produces n one-message tenants named
// prefix-i over 4 partitions and waits until the engine tracks more than
// one and a half times MaxIdleTenants of them: the pressure under which a
// tenant's only message runs without its guard (see Config.MaxIdleTenants).
// handle runs after the wait for each message.
func loneRun(t *testing.T, prefix string, n int, handle func(tenant string) error) (*engine, *consumertest.Recorder, chan struct{}) {
	t.Helper()
	h := consumertest.NewMemHarness(4)
	rec := consumertest.NewRecorder()
	open := make(chan struct{})
	e := run(t, h, fastPolicy(), consumer.Config{
		MaxIdleTenants: 2,
		Concurrency:    4,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			<-open
			tn, _ := m.Header(consumertest.TenantHeader)
			if err := handle(string(tn)); err != nil {
				return err
			}
			rec.Add(string(tn), string(m.Value))
			return nil
		}),
	})
	produceMany(h, prefix, n)
	consumertest.Eventually(t, "the tenants tracked", func() bool { return e.c.Stats().Tracked.Tenants > n/2 })
	return e, rec, open
}

// TestTenantsSeenOnceMakeNoGuards: under that pressure a tenant's only
// message, handled at its first attempt, builds no guard in the scope;
// every message is handled once all the same.
func TestTenantsSeenOnceMakeNoGuards(t *testing.T) {
	t.Parallel()
	const n = 200
	var calls atomic.Int32
	e, rec, open := loneRun(t, "once", n, func(string) error { calls.Add(1); return nil })
	close(open)
	consumertest.Eventually(t, "every tenant handled", func() bool { return rec.Distinct() == n })
	if got := calls.Load(); got != n {
		t.Fatalf("%d handler calls for %d messages", got, n)
	}
	// The 4 calls started before the tenants piled up, and the last few
	// once no more than one and a half times MaxIdleTenants are left, use
	// their guards.
	if m := e.c.Scope().Stats().Misses; m > n/4 {
		t.Fatalf("the scope built %d guards for %d tenants seen once, want at most %d", m, n, n/4)
	}
	checkInvariants(t, e.c)
}

// TestLoneTenantFailureCountsInItsGuard: a tenant whose only message fails
// at its first attempt gets its guard then, which counts that failure and
// the next ones; the message is retried and handled once.
func TestLoneTenantFailureCountsInItsGuard(t *testing.T) {
	t.Parallel()
	var fails atomic.Int32
	e, rec, open := loneRun(t, "f", 100, func(tn string) error {
		if tn == "f-50" && fails.Add(1) <= 2 {
			return errors.New("dependency down")
		}
		return nil
	})
	close(open)
	consumertest.Eventually(t, "every tenant handled", func() bool { return rec.Distinct() == 100 })
	if got := rec.Count("f-50"); got != 1 {
		t.Fatalf("f-50 handled %d times, want 1", got)
	}
	g, ok := e.c.Scope().Peek("f-50")
	if !ok {
		t.Fatal("f-50 failed but has no guard in the scope")
	}
	if st := g.Stats(); st.Failures != 2 || st.Successes != 1 {
		t.Fatalf("f-50's guard counts %d failures and %d successes, want 2 and 1", st.Failures, st.Successes)
	}
}

// TestLoneTenantKeepsItsOpenBreaker: a key whose guard the scope still
// holds (an earlier stay of the tenant, its breaker open) runs on that
// guard, not without one: its message waits for the breaker while the
// other tenants seen once are handled.
func TestLoneTenantKeepsItsOpenBreaker(t *testing.T) {
	t.Parallel()
	var called atomic.Bool
	e, rec, open := loneRun(t, "before", 50, func(tn string) error {
		if tn == "tripped" {
			called.Store(true)
		}
		return nil
	})
	e.c.Scope().For("tripped").Trip(time.Now().Add(time.Hour))
	produce(e.h, "tripped", 1, 0)
	produceMany(e.h, "after", 50)
	close(open)
	consumertest.Eventually(t, "the other tenants handled", func() bool { return rec.Distinct() >= 100 })
	consumertest.Eventually(t, "tripped parked", func() bool {
		ts, ok := e.c.Tenant("tripped")
		return ok && ts.Parked == 1
	})
	if called.Load() || rec.Count("tripped") != 0 {
		t.Fatal("the handler ran for a tenant whose breaker the scope holds open")
	}
}

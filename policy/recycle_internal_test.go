package policy

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"
)

// TestInitResetsEveryField dirties every part of a recycled state through
// the public API, has it reused, and compares it field by field (unexported
// ones included, by reflection) with a state that was never used: a field
// added to guard and forgotten by init fails here.
func TestInitResetsEveryField(t *testing.T) {
	p := Default()
	p.Breaker = &Breaker{ConsecutiveFailures: 50, FailureRatio: 0.5, MinRequests: 4, Window: time.Second, OpenTimeout: time.Hour}
	p.Budget = &Budget{MinPerSecond: 1}
	p.Bulkhead = Bulkhead{Adaptive: true}
	p.Latency.SampleEvery = 1
	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	p.Clock = clk
	c, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	rc := NewRecycler(1)
	h := rc.New(c, func(Event) {})
	ctx := context.Background()
	boom := errors.New("boom")
	for range 40 {
		_ = h.Run(ctx, func(context.Context) error { clk.advance(time.Millisecond); return nil })
	}
	_ = h.Run(ctx, func(context.Context) error { clk.advance(time.Second); return nil }) // a slow call
	_ = h.Concurrency(7)
	for i := 1; i < 30; i++ { // spends the bucket and then the floor
		_ = h.NextRetry(1, boom, 0)
	}
	for h.State() != Open {
		pm, err := h.Allow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		clk.advance(time.Second) // slow samples: the baseline drifts
		pm.Done(boom)
	}
	_ = h.Run(ctx, func(context.Context) error { return nil }) // rejected
	_ = h.RetryAfter()
	g := h.st.Load()
	if g.openErr.Load() == nil || g.samples.Load() == 0 || g.lat.est.Load() == 0 || g.spent.Load() == 0 || g.trips == 0 ||
		g.slowAt.Load() == c.r.slowFixed || g.lat.drift.Load() == 0 || g.lat.limit.Load() == 0 || g.lat.hint.Load() == 0 ||
		g.stats().SlowCalls == 0 {
		t.Fatal("the state was not dirtied everywhere this test means to check")
	}
	g.inflight.Store(3) // a Run always counts out; dirtied here to see init reset it
	rc.Retire(h)
	h2 := rc.New(c, nil)
	if h2.st.Load() != g {
		t.Fatal("the retired state was not reused")
	}
	fresh := &guard{pool: rc}
	fresh.init(c.r, nil)
	fresh.life.Store(g.life.Load())
	if !reflect.DeepEqual(g, fresh) {
		t.Fatalf("recycled state differs from a new one:\n got %+v\nwant %+v", g, fresh)
	}
}

// stepClock is a Clock that moves only when told.
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *stepClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

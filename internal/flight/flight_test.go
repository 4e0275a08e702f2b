package flight

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Callers of one key share one call; a key whose call is stuck does not
// delay another key; a failure is not kept.
func TestGroup(t *testing.T) {
	t.Parallel()
	var g Group[int]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	release := make(chan struct{})
	started := make(chan struct{})
	var calls atomic.Int32
	slow := func(context.Context) (int, error) {
		calls.Add(1)
		close(started)
		<-release
		return 1, nil
	}
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			if v, err := g.Do(ctx, "slow", slow); v != 1 || err != nil {
				t.Errorf("slow key = %d, %v", v, err)
			}
		})
	}
	<-started
	// Another key goes through while "slow" is stuck.
	if v, err := g.Do(ctx, "fast", func(context.Context) (int, error) { return 2, nil }); v != 2 || err != nil {
		t.Fatalf("fast key = %d, %v", v, err)
	}
	close(release)
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("slow key looked up %d times, want once", n)
	}
	if v, _ := g.Do(ctx, "slow", func(context.Context) (int, error) { return 9, nil }); v != 1 {
		t.Fatalf("cached value %d, want 1", v)
	}

	boom := errors.New("boom")
	if _, err := g.Do(ctx, "bad", func(context.Context) (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("failed lookup err = %v", err)
	}
	if v, err := g.Do(ctx, "bad", func(context.Context) (int, error) { return 3, nil }); v != 3 || err != nil {
		t.Fatalf("after a failure = %d, %v; want a fresh lookup", v, err)
	}
	g.Set("bad", 4)
	if v, _ := g.Do(ctx, "bad", nil); v != 4 {
		t.Fatalf("after Set = %d", v)
	}
	g.Forget("bad", nil)
	if v, _ := g.Do(ctx, "bad", func(context.Context) (int, error) { return 5, nil }); v != 5 {
		t.Fatalf("after Forget = %d", v)
	}

	// A waiter whose ctx ends stops waiting.
	stuck, running := make(chan struct{}), make(chan struct{})
	defer close(stuck)
	go g.Do(ctx, "stuck", func(context.Context) (int, error) { close(running); <-stuck; return 0, nil })
	<-running
	short, cancelShort := context.WithCancel(ctx)
	cancelShort()
	if _, err := g.Do(short, "stuck", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter with an ended ctx: %v", err)
	}
}

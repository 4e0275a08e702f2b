package policy_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// TestRunAttemptContext checks the ctx Run gives an attempt under an
// AttemptTimeout against the context contract. Each case runs in a
// testing/synctest bubble, whose clock is the one attempt timers follow:
// time moves only when every goroutine of the bubble waits, so no case
// depends on the machine's speed.
func TestRunAttemptContext(t *testing.T) {
	t.Parallel()
	// Attempts within AttemptTimeout/128 (1ms) of each other may share a
	// ctx, whose deadline is the first one's start plus timeout+ms.
	const timeout = 128 * time.Millisecond
	const ms = time.Millisecond
	type key struct{}
	valued := func() context.Context { return context.WithValue(context.Background(), key{}, "v") }
	tests := []struct {
		name string
		run  func(t *testing.T, g *policy.Guard)
	}{
		{"deadline and values, before Done", func(t *testing.T, g *policy.Guard) {
			start := time.Now()
			err := g.Run(valued(), func(ctx context.Context) error {
				if dl, ok := ctx.Deadline(); !ok || dl.Sub(start) != timeout+ms {
					t.Errorf("Deadline %v after start, %v; want %v", dl.Sub(start), ok, timeout+ms)
				}
				if ctx.Value(key{}) != "v" || ctx.Err() != nil {
					t.Errorf("Value %v, Err %v", ctx.Value(key{}), ctx.Err())
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}},
		{"a hang ends at the deadline", func(t *testing.T, g *policy.Guard) {
			start := time.Now()
			err := g.Run(valued(), func(ctx context.Context) error {
				<-ctx.Done()
				if took := time.Since(start); took != timeout+ms {
					t.Errorf("ended after %v, want %v", took, timeout+ms)
				}
				if ctx.Err() != context.DeadlineExceeded || context.Cause(ctx) != context.DeadlineExceeded || ctx.Value(key{}) != "v" {
					t.Errorf("Err %v, Cause %v, Value %v once ended", ctx.Err(), context.Cause(ctx), ctx.Value(key{}))
				}
				return ctx.Err()
			})
			if !errors.Is(err, policy.ErrAttemptTimeout) {
				t.Fatalf("Run = %v, want an attempt timeout", err)
			}
		}},
		{"Err alone sees the deadline", func(t *testing.T, g *policy.Guard) {
			_ = g.Run(context.Background(), func(ctx context.Context) error {
				const tick = time.Nanosecond
				time.Sleep(timeout + ms - tick)
				if err := ctx.Err(); err != nil {
					t.Errorf("Err %v before the deadline", err)
				}
				time.Sleep(tick)
				if err := ctx.Err(); err != context.DeadlineExceeded {
					t.Errorf("Err %v at the deadline", err)
				}
				if context.Cause(ctx) != context.DeadlineExceeded {
					t.Errorf("Cause %v at the deadline", context.Cause(ctx))
				}
				select {
				case <-ctx.Done():
				default:
					t.Error("Done open after Err reported the deadline")
				}
				return ctx.Err()
			})
		}},
		{"the parent's cancellation ends it", func(t *testing.T, g *policy.Guard) {
			parent, cancel := context.WithCancel(valued())
			start := time.Now()
			time.AfterFunc(10*ms, cancel)
			_ = g.Run(parent, func(ctx context.Context) error {
				<-ctx.Done()
				if took := time.Since(start); took != 10*ms || ctx.Err() != context.Canceled {
					t.Errorf("ended after %v with %v, want the parent's cancel at 10ms", took, ctx.Err())
				}
				return ctx.Err()
			})
		}},
		{"the parent's cancellation, seen by Err alone", func(t *testing.T, g *policy.Guard) {
			parent, cancel := context.WithCancel(context.Background())
			_ = g.Run(parent, func(ctx context.Context) error {
				cancel()
				if ctx.Err() != context.Canceled || context.Cause(ctx) != context.Canceled {
					t.Errorf("Err %v, Cause %v after the parent was canceled", ctx.Err(), context.Cause(ctx))
				}
				return nil
			})
		}},
		{"an earlier parent deadline wins", func(t *testing.T, g *policy.Guard) {
			parent, cancel := context.WithTimeout(context.Background(), 30*ms)
			defer cancel()
			start := time.Now()
			_ = g.Run(parent, func(ctx context.Context) error {
				if dl, _ := ctx.Deadline(); dl.Sub(start) != 30*ms {
					t.Errorf("Deadline %v after start, want the parent's 30ms", dl.Sub(start))
				}
				<-ctx.Done()
				if time.Since(start) != 30*ms || ctx.Err() != context.DeadlineExceeded {
					t.Errorf("ended after %v with %v", time.Since(start), ctx.Err())
				}
				return nil
			})
		}},
		{"a kept ctx ends with its attempt", func(t *testing.T, g *policy.Guard) {
			for _, askDone := range []bool{false, true} {
				var kept context.Context
				var done <-chan struct{}
				_ = g.Run(context.Background(), func(ctx context.Context) error {
					kept = ctx
					if askDone {
						done = kept.Done()
					}
					return nil
				})
				if kept.Err() != context.Canceled {
					t.Fatalf("askDone=%v: kept ctx Err %v after its attempt", askDone, kept.Err())
				}
				if done == nil {
					done = kept.Done()
				}
				select {
				case <-done:
				default:
					t.Fatalf("askDone=%v: kept ctx not done after its attempt", askDone)
				}
				// The next attempt gets a live ctx of its own.
				_ = g.Run(context.Background(), func(ctx context.Context) error {
					if ctx == kept || ctx.Err() != nil {
						t.Errorf("askDone=%v: next attempt got the ended ctx (Err %v)", askDone, ctx.Err())
					}
					return nil
				})
			}
		}},
		{"attempts starting together share a ctx until the last ends", func(t *testing.T, g *policy.Guard) {
			parent := valued()
			var first, second context.Context
			release := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				_ = g.Run(parent, func(ctx context.Context) error {
					first = ctx
					<-release
					return nil
				})
			})
			synctest.Wait()
			_ = g.Run(parent, func(ctx context.Context) error { second = ctx; return nil })
			if first != second {
				t.Fatal("two attempts started together with one parent got two ctxs")
			}
			if second.Err() != nil {
				t.Fatalf("shared ctx ended (%v) while an attempt still uses it", second.Err())
			}
			close(release)
			wg.Wait()
			if second.Err() != context.Canceled {
				t.Fatalf("shared ctx Err %v after its last attempt", second.Err())
			}
		}},
		{"another parent or a later deadline gets its own ctx", func(t *testing.T, g *policy.Guard) {
			var ctxs []context.Context
			keep := func(ctx context.Context) error { ctxs = append(ctxs, ctx); return nil }
			_ = g.Run(context.Background(), keep)
			_ = g.Run(valued(), keep)
			time.Sleep(ms + 1)
			_ = g.Run(context.Background(), keep)
			if ctxs[0] == ctxs[1] || ctxs[0] == ctxs[2] || ctxs[1] == ctxs[2] {
				t.Fatal("attempts with another parent or deadline shared a ctx")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				tt.run(t, mustNew(t, policy.Policy{AttemptTimeout: timeout}))
			})
		})
	}
}

// TestRunAttemptContextsEnd runs attempts concurrently on one guard, each
// asking for Done, Err, both or neither, and keeping its ctx: once every
// Run returned, every ctx handed out must have ended.
func TestRunAttemptContextsEnd(t *testing.T) {
	t.Parallel()
	g := mustNew(t, policy.Default())
	type key struct{}
	parents := []context.Context{context.Background(), context.WithValue(context.Background(), key{}, 1)}
	var mu sync.Mutex
	var kept []context.Context
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 500 {
				_ = g.Run(parents[(w+i)%2], func(ctx context.Context) error {
					switch rand.N(4) {
					case 1:
						_ = ctx.Done()
					case 2:
						_ = ctx.Err()
					case 3:
						_ = ctx.Done()
						_ = ctx.Err()
					}
					mu.Lock()
					kept = append(kept, ctx)
					mu.Unlock()
					return nil
				})
			}
		})
	}
	wg.Wait()
	for i, ctx := range kept {
		if ctx.Err() != context.Canceled {
			t.Fatalf("ctx %d: Err %v once every attempt ended", i, ctx.Err())
		}
		<-ctx.Done()
	}
}

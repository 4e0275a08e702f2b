package policy_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ringfence/ringfence/policy"
)

var (
	errFail = errors.New("test: dependency failed")
	errSkip = errors.New("test: excluded")
)

// okFn is a unit of work that succeeds.
func okFn(context.Context) error { return nil }

// fakeClock is a Clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// recorder collects events and hook calls in order.
type recorder struct {
	mu  sync.Mutex
	log []string
	evs []policy.Event
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.log = append(r.log, s)
	r.mu.Unlock()
}

func (r *recorder) event(e policy.Event) {
	r.mu.Lock()
	r.log = append(r.log, e.Kind.String())
	r.evs = append(r.evs, e)
	r.mu.Unlock()
}

func (r *recorder) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.log...)
}

func (r *recorder) events() []policy.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]policy.Event(nil), r.evs...)
}

func mustNew(t testing.TB, p policy.Policy) *policy.Guard {
	t.Helper()
	g, err := policy.New(p)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return g
}

func equalLines(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

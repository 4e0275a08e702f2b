package consumer

import (
	"context"
	"testing"

	"github.com/ringfence/ringfence/dlq"
)

// nopSink takes every dead letter.
type nopSink struct{}

func (nopSink) Write(context.Context, *dlq.Record) error { return nil }

// A Weight override sets a lane's fair-share credit (its turns against
// other lanes of its partition), and a Concurrency override its bulkhead
// limit, capped at Concurrency.
func TestControlOverridesShareAndLimit(t *testing.T) {
	c, err := New(Config{
		Handler:           HandlerFunc(func(context.Context, *Message) error { return nil }),
		Tenant:            FromKey(),
		DLQ:               nopSink{},
		Concurrency:       8,
		TenantConcurrency: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	tn := c.tenantFor("a", keyHash("a"))
	if credit, _ := c.creditOf(tn, nil); credit != 1 {
		t.Fatalf("credit %d without a control, want 1", credit)
	}
	if credit, _ := c.creditOf(tn, &Control{Weight: 5}); credit != 5 {
		t.Fatalf("credit %d with Weight 5, want 5", credit)
	}
	c.guard(tn) // the guard's weight is 1 (the default policy)
	if credit, _ := c.creditOf(tn, &Control{Weight: 5}); credit != 5 {
		t.Fatalf("credit %d with Weight 5 and a guard, want 5", credit)
	}
	if got := c.limitWith(tn, nil); got != 2 {
		t.Fatalf("limit %d, want TenantConcurrency 2", got)
	}
	if got := c.limitWith(tn, &Control{Concurrency: 5}); got != 5 {
		t.Fatalf("limit %d with Concurrency 5, want 5", got)
	}
	if got := c.limitWith(tn, &Control{Concurrency: 50}); got != 8 {
		t.Fatalf("limit %d with Concurrency 50, want Concurrency 8", got)
	}
}

func TestParseBreakerOverride(t *testing.T) {
	for _, b := range []BreakerOverride{BreakerAuto, BreakerForceOpen, BreakerForceClosed} {
		text, err := b.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got BreakerOverride
		if err := got.UnmarshalText(text); err != nil || got != b {
			t.Fatalf("%v: round trip gave %v, %v", b, got, err)
		}
	}
	if _, err := ParseBreakerOverride("opened"); err == nil {
		t.Fatal("no error for an unknown override")
	}
}

func FuzzParseBreakerOverride(f *testing.F) {
	for _, s := range []string{"", "auto", "open", "closed", "Open", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseBreakerOverride(s)
		if err != nil {
			return
		}
		if s != "" && b.String() != s {
			t.Fatalf("%q parsed as %v", s, b)
		}
	})
}

package consumer_test

// Tenant keys: how a message's tenant is read, and what happens to a
// message without one.

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
)

// A message with no tenant key, or one over MaxTenantLen, goes to the
// no-tenant DLQ bucket with a reason, never dropped.
func TestMissingOrInvalidTenantIsDeadLettered(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	h.Produce(t, consumertest.Msg{Value: []byte("orphan")})
	h.Produce(t, consumertest.Msg{Tenant: strings.Repeat("k", 5000), Value: []byte("huge-key")})
	produce(h, "A", 0, 0)
	rec := consumertest.NewRecorder()
	e := run(t, h, fastPolicy(), consumer.Config{MaxTenantLen: 4096, Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		rec.Add("", string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "two no-tenant letters and one handled", func() bool {
		return len(h.S.Records("", true)) == 2 && rec.Distinct() == 1
	})
	got := h.S.Records("", true)
	if got[0].Reason != dlq.ReasonNoTenant || string(got[0].Value) != "orphan" {
		t.Fatalf("first: reason %q value %q", got[0].Reason, got[0].Value)
	}
	if got[1].Reason != dlq.ReasonInvalidTenant || !strings.Contains(got[1].Error, "MaxTenantLen") {
		t.Fatalf("second: reason %q error %q", got[1].Reason, got[1].Error)
	}
	e.stop()
	if c := h.B.Committed(h.Group, 0); c != 3 {
		t.Fatalf("committed %d, want 3", c)
	}
}

func TestTenantExtractors(t *testing.T) {
	t.Parallel()
	m := &consumer.Message{Key: []byte("k1"), Headers: []dlq.Header{{Key: "x-tenant", Value: []byte("acme")}}}
	if got, err := consumer.FromHeader("x-tenant")(m); err != nil || got != "acme" {
		t.Fatalf("FromHeader = %q, %v", got, err)
	}
	if _, err := consumer.FromHeader("absent")(m); !errors.Is(err, consumer.ErrNoTenant) {
		t.Fatalf("missing header err = %v", err)
	}
	if got, err := consumer.FromKey()(m); err != nil || got != "k1" {
		t.Fatalf("FromKey = %q, %v", got, err)
	}
	if _, err := consumer.FromKey()(&consumer.Message{}); !errors.Is(err, consumer.ErrNoTenant) {
		t.Fatalf("empty key err = %v", err)
	}
}

// The no-tenant bucket is kept apart by type, not by a reserved name:
// every key is a tenant, including keys that look like a bucket's name,
// and only a message with no key is dead-lettered.
func TestNoKeyIsReserved(t *testing.T) {
	h := consumertest.NewMemHarness(1)
	for _, key := range []string{"\x00ringfence:no-tenant", "\x00", "no-tenant"} {
		h.Produce(t, consumertest.Msg{Tenant: key, Value: []byte(key)})
	}
	h.Produce(t, consumertest.Msg{Value: []byte("orphan")})
	rec := consumertest.NewRecorder()
	c := startWith(t, consumer.Config{
		Tenant: h.Tenant(),
		DLQ:    h.S,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			rec.Add("", string(m.Value))
			return nil
		}),
	}, h.NewSource(t))
	consumertest.Eventually(t, "three tenants handled, the orphan dead-lettered", func() bool {
		return rec.Distinct() == 3 && len(h.S.Records("", true)) == 1
	})
	if n := h.S.Total(); n != 1 {
		t.Fatalf("%d dead letters, want only the orphan", n)
	}
	var none, named int
	for _, ts := range c.Stats().Tenants {
		if ts.NoTenant {
			none++
		} else {
			named++
		}
	}
	if none != 1 || named != 3 {
		t.Fatalf("stats list %d no-tenant buckets and %d tenants, want 1 and 3", none, named)
	}
}

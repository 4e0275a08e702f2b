package consumer_test

// Dead letters: what reaches a tenant's DLQ, and what happens while the
// DLQ cannot take it. When a failing message is judged poison, see
// poison_test.go.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// One message of A fails permanently: exactly that one reaches A's DLQ,
// with reason and attempts; A's others are handled; no other tenant gets a
// dead letter.
func TestPermanentErrorDeadLettersOnlyThatMessage(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(2)
	for i := range 10 {
		produce(h, "A", 0, i)
		produce(h, "B", 1, i)
	}
	rec := consumertest.NewRecorder()
	run(t, h, fastPolicy(), consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if string(m.Value) == "A/0/000004" {
			return policy.Permanent(errors.New("schema violation"))
		}
		tn, _ := m.Header(consumertest.TenantHeader)
		rec.Add(string(tn), string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "19 handled and one dead letter", func() bool { return rec.Distinct() == 19 && h.S.Total() == 1 })
	got := h.S.Records("A", false)
	if len(got) != 1 || string(got[0].Value) != "A/0/000004" || got[0].Reason != dlq.ReasonPermanent || got[0].Attempts != 1 {
		t.Fatalf("A's DLQ = %+v", got)
	}
	if !strings.Contains(got[0].Error, "schema violation") || got[0].Offset != 4 || got[0].Group != "" && got[0].Group != h.Group {
		t.Fatalf("record fields: error %q offset %d", got[0].Error, got[0].Offset)
	}
	if n := len(h.S.Records("B", false)); n != 0 {
		t.Fatalf("B got %d dead letters", n)
	}
}

// A handler whose error wraps policy.ErrOpen (it called a downstream
// through a guard of its own) is not the tenant's own breaker refusing: it
// neither resets the message's attempts nor parks its lane, with or without
// a breaker. The handler's errors are the handler's: the message uses its
// attempts and is dead-lettered on evidence.
func TestHandlerErrorWrappingErrOpenIsDeadLettered(t *testing.T) {
	for _, withBreaker := range []bool{false, true} {
		t.Run(fmt.Sprintf("breaker=%v", withBreaker), func(t *testing.T) {
			p := policy.Policy{Retry: policy.Retry{MaxAttempts: 3, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}}}
			if withBreaker {
				p.Breaker = &policy.Breaker{ConsecutiveFailures: 50, OpenTimeout: 20 * time.Millisecond}
			}
			sink := consumertest.NewSink()
			var calls atomic.Int64
			src := newGenSource(2, func(i int) *consumer.Message { return tenantMsg("acme", []string{"inventory", "next"}[i]) })
			c := startWith(t, consumer.Config{
				Scope: scope.New(p, scope.Options[string]{}),
				DLQ:   sink,
				Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
					if string(m.Value) == "inventory" {
						calls.Add(1)
						return fmt.Errorf("inventory service: %w", policy.ErrOpen)
					}
					return nil
				}),
			}, src)
			consumertest.Eventually(t, "the inventory message dead-lettered", func() bool { return len(sink.Records("acme", false)) == 1 })
			rec := sink.Records("acme", false)[0]
			if rec.Reason != dlq.ReasonExhausted || string(rec.Value) != "inventory" {
				t.Fatalf("dead letter %q reason %q, want the inventory message, exhausted", rec.Value, rec.Reason)
			}
			if n := calls.Load(); n > 10 {
				t.Fatalf("the handler was called %d times for one message with 3 attempts", n)
			}
			if s := c.Stats(); s.Handled != 1 {
				t.Fatalf("handled %d, want the message behind it", s.Handled)
			}
		})
	}
}

// While the sink fails, a message to dead-letter stays unsettled (the
// commit does not pass it, nor does its tenant's next message run) and the
// write is retried; once the sink is back it lands there and the commit
// moves on. Nothing is lost.
func TestDeadLetterWaitsForTheDLQ(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	h.S.SetDown(true)
	produce(h, "A", 0, 0)
	produce(h, "A", 0, 1)
	produce(h, "A", 0, 2)
	rec := consumertest.NewRecorder()
	run(t, h, fastPolicy(), consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if string(m.Value) == "A/0/000001" {
			return policy.Permanent(errors.New("bad"))
		}
		rec.Add("A", string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "DLQ writes refused a few times", func() bool { return h.S.Failures() >= 3 })
	if c := h.B.Committed(h.Group, 0); c > 1 {
		t.Fatalf("committed %d past the message whose dead letter was not written", c)
	}
	if rec.Has("A/0/000002") {
		t.Fatal("a later message of the tenant was handled before the earlier one was settled")
	}
	h.S.SetDown(false)
	consumertest.Eventually(t, "dead letter written and the rest handled", func() bool {
		return h.S.Total() == 1 && rec.Distinct() == 2 && h.B.Committed(h.Group, 0) == 3
	})
}

// A dead letter the DLQ says can never be written (too large
// even for its limits) must not wedge its tenant: it is logged once at
// Error, counted, set aside (unsettled: it holds its partition's commit,
// as at-least-once requires) and the tenant's next messages, and the
// others', flow.
func TestUnwritableDeadLetterIsSetAside(t *testing.T) {
	var logs syncBuffer
	sink := dlq.SinkFunc(func(ctx context.Context, r *dlq.Record) error {
		if string(r.Value) == "huge" {
			return fmt.Errorf("dlq: record of 9 MiB over the topic's limit: %w", dlq.ErrUnwritable)
		}
		return nil
	})
	src := newGenSource(4, func(i int) *consumer.Message {
		return tenantMsg([]string{"acme", "acme", "acme", "globex"}[i], []string{"huge", "ok", "ok", "ok"}[i])
	})
	var handled atomic.Int64
	c := startWith(t, consumer.Config{
		DLQ:    sink,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == "huge" {
				return policy.Permanent(errors.New("cannot parse"))
			}
			handled.Add(1)
			return nil
		}),
	}, src)
	consumertest.Eventually(t, "the messages behind it handled", func() bool { return handled.Load() == 3 })
	s := c.Stats()
	if s.Unwritable != 1 || s.DeadLettered != 0 {
		t.Fatalf("unwritable %d, dead-lettered %d; want 1 and 0", s.Unwritable, s.DeadLettered)
	}
	if len(s.Partitions) != 1 || s.Partitions[0].Unsettled != 1 || s.Partitions[0].CommitLag != 4 {
		t.Fatalf("partition %+v: the set-aside message must stay unsettled and hold the commit", s.Partitions)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 || !strings.Contains(logs.String(), "cannot be written") {
		t.Fatalf("%d Error lines, want one:\n%s", n, logs.String())
	}
	if ts, _ := c.Tenant("acme"); ts.Unwritable != 1 || ts.Handled != 2 {
		t.Fatalf("acme: %+v", ts)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (a logger).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

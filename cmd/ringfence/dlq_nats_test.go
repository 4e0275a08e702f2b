package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/natstest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

func TestDLQNATS(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The source stream the dead letters came from, so replay has a home.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	q, err := rfnats.NewDLQ(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	seq := uint64(1)
	for tenant, n := range map[string]int{"acme": 3, "globex": 2, hostile: 1} {
		for i := range n {
			r := &dlq.Record{
				Tenant: tenant, Value: []byte(tenant + " order " + string(rune('a'+i))),
				Headers: []dlq.Header{{Key: "tenant", Value: []byte(tenant)}},
				Source:  "orders.eu", Offset: -1, Stream: "ORDERS", Sequence: seq, Group: "billing",
				Attempts: 2, FirstFailure: now.Add(-time.Minute), LastFailure: now,
				Error: "inventory service: 503", ErrorType: "*errors.errorString", Reason: dlq.ReasonPoison,
			}
			seq++
			if err := q.Write(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	base := []string{"--nats", srv.URL(), "--stream", rfnats.DefaultDLQStream}

	code, out, errs := cli(t, append([]string{"dlq", "ls"}, base...)...)
	if code != 0 {
		t.Fatalf("ls exit %d: %s", code, errs)
	}
	t.Logf("ls:\n%s", out)
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 4 {
		t.Fatalf("ls table has %d lines, want header + 3:\n%s", len(lines), out)
	}
	if c := counts(t, base); c["acme"] != 3 || c["globex"] != 2 || c[hostile] != 1 || len(c) != 3 {
		t.Fatalf("counts %v", c)
	}

	code, out, errs = cli(t, append([]string{"dlq", "peek", "--tenant", "acme", "-n", "1"}, base...)...)
	if code != 0 {
		t.Fatalf("peek exit %d: %s", code, errs)
	}
	t.Logf("peek:\n%s", out)
	for _, want := range []string{"acme", "orders.eu (stream ORDERS, sequence", "poison after 2 attempt(s)", "inventory service: 503", "acme order a"} {
		if !strings.Contains(out, want) {
			t.Fatalf("peek output lacks %q:\n%s", want, out)
		}
	}

	// Replay globex's two: they leave the DLQ and reach the source stream,
	// where the engine handles them with the redrive count raised.
	code, out, errs = cli(t, append([]string{"dlq", "replay", "--tenant", "globex"}, base...)...)
	if code != 0 || !strings.Contains(out, "replayed 2") {
		t.Fatalf("replay exit %d: %s %s", code, out, errs)
	}
	if c := counts(t, base); c["globex"] != 0 || c["acme"] != 3 {
		t.Fatalf("after replay: %v", c)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "cli", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	src, err := rfnats.Open(ctx, nc, "ORDERS", "cli")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := 0
	c, err := consumer.New(consumer.Config{
		Scope:  scope.New(policy.Default(), scope.Options[string]{}),
		Tenant: consumer.FromHeader("tenant"),
		DLQ:    q,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if tn, _ := m.Header("tenant"); string(tn) == "globex" && dlq.RedriveCount(m.Headers) == 1 {
				mu.Lock()
				got++
				mu.Unlock()
			}
			return nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx, src) }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		g := got
		mu.Unlock()
		if g == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine handled %d of 2 replayed messages", g)
		}
	}
	rcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Purge: refused without --yes; then exactly the hostile tenant.
	if code, _, errs = cli(t, append([]string{"dlq", "purge", "--tenant", hostile}, base...)...); code != 2 {
		t.Fatalf("purge without --yes: exit %d %s", code, errs)
	}
	code, out, errs = cli(t, append([]string{"dlq", "purge", "--tenant", hostile, "--yes"}, base...)...)
	if code != 0 || !strings.Contains(out, "purged 1") {
		t.Fatalf("purge exit %d: %s %s", code, out, errs)
	}
	if c := counts(t, base); c[hostile] != 0 || c["acme"] != 3 {
		t.Fatalf("after purge: %v", c)
	}

	// A stream that does not exist is an error, not a new empty DLQ.
	code, _, errs = cli(t, "dlq", "ls", "--nats", srv.URL(), "--stream", "NOPE")
	if code != 1 || !strings.Contains(errs, "no DLQ stream") {
		t.Fatalf("missing stream: exit %d %s", code, errs)
	}
}

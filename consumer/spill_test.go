package consumer_test

// Spilling. The spill cases every adapter must pass are in consumertest
// (RunSpillLog and Run's Spill cases); these are the engine's own.

import (
	"context"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
)

// A spill log that is down when a partition is assigned holds the source's
// Assigned callback: the engine retries Pending there, before any message
// of the partition is delivered, so that each spilled tenant's order holds.
// Cancelling Run must still end it: the drain ends what waits on the
// engine's context, and the source's Run returns.
func TestRunEndsWhileSpillLogIsDownAtAssign(t *testing.T) {
	h := consumertest.NewMemHarness(2)
	h.Sp.SetDown(true)
	c, err := consumer.New(consumer.Config{
		Handler:      consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
		Tenant:       h.Tenant(),
		DLQ:          h.S,
		Spill:        h.Sp,
		DrainTimeout: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h.NewSource(t)) }()
	consumertest.Eventually(t, "Pending refused and retried", func() bool { return h.Sp.Failures() >= 2 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s of cancel while the spill log was down at assignment")
	}
}

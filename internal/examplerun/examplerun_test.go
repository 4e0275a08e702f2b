package examplerun

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/scope"
)

func newConsumer(t *testing.T) *consumer.Consumer {
	t.Helper()
	c, err := consumer.New(consumer.Config{
		Scope:   scope.New(consumertest.FastPolicy(), scope.Options[string]{}),
		Tenant:  consumer.FromKey(),
		Handler: consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
		DLQ:     consumertest.NewSink(),
		Group:   "g",
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestUntilSettledReturnsOnceEveryMessageIsSettled(t *testing.T) {
	t.Parallel()
	b := consumertest.NewBroker("t", 2)
	for i := range 10 {
		b.Append(i%2, []byte("acme"), []byte("m"))
	}
	c := newConsumer(t)
	if err := UntilSettled(testContext(t), c, b.Source("g"), 10); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Handled != 10 {
		t.Fatalf("handled %d, want 10", st.Handled)
	}
}

func TestUntilSettledReportsAFailedSource(t *testing.T) {
	t.Parallel()
	b := consumertest.NewBroker("t", 1)
	src := b.Source("g")
	boom := errors.New("broker gone")
	src.Kill(boom)
	err := UntilSettled(testContext(t), newConsumer(t), src, 1)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
}

func TestUntilSettledEndsWithItsContext(t *testing.T) {
	t.Parallel()
	b := consumertest.NewBroker("t", 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := UntilSettled(ctx, newConsumer(t), b.Source("g"), 1)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
)

// Required fields and negative limits are refused.
func TestNewRefusesInvalidConfig(t *testing.T) {
	t.Parallel()
	ok := consumer.Config{
		Handler: consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
		Tenant:  consumer.FromKey(),
		DLQ:     consumertest.NewSink(),
	}
	cases := []struct {
		name  string
		edit  func(*consumer.Config)
		field string
	}{
		{"no handler", func(c *consumer.Config) { c.Handler = nil }, "Handler"},
		{"no tenant", func(c *consumer.Config) { c.Tenant = nil }, "Tenant"},
		{"no dlq", func(c *consumer.Config) { c.DLQ = nil }, "DLQ"},
		{"negative concurrency", func(c *consumer.Config) { c.Concurrency = -1 }, "Concurrency"},
		{"negative parked", func(c *consumer.Config) { c.MaxParked = -5 }, "MaxParked"},
		{"negative idle tenants", func(c *consumer.Config) { c.MaxIdleTenants = -1 }, "MaxIdleTenants"},
		{"negative DLQ probe", func(c *consumer.Config) { c.DLQProbe = -time.Second }, "DLQProbe"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.edit(&cfg)
			_, err := consumer.New(cfg)
			if !errors.Is(err, consumer.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("err = %v, want ErrInvalidConfig naming %s", err, tc.field)
			}
		})
	}
	if _, err := consumer.New(ok); err != nil {
		t.Fatal(err)
	}
}

// A typed nil DLQ (or handler, or spill log) is refused by New rather than
// panicking a worker at the first dead letter.
func TestNewRefusesTypedNils(t *testing.T) {
	var sink *consumertest.Sink
	var spill *consumertest.Spill
	var hf consumer.HandlerFunc
	ok := consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil })
	for _, tc := range []struct {
		name string
		cfg  consumer.Config
	}{
		{"nil *Sink as DLQ", consumer.Config{Handler: ok, Tenant: consumer.FromKey(), DLQ: sink}},
		{"nil HandlerFunc", consumer.Config{Handler: hf, Tenant: consumer.FromKey(), DLQ: consumertest.NewSink()}},
		{"nil *Spill as Spill", consumer.Config{Handler: ok, Tenant: consumer.FromKey(), DLQ: consumertest.NewSink(), Spill: spill}},
	} {
		if _, err := consumer.New(tc.cfg); !errors.Is(err, consumer.ErrInvalidConfig) {
			t.Errorf("%s: New returned %v, want ErrInvalidConfig", tc.name, err)
		}
	}
}

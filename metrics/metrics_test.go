package metrics_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/metrics"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// settledConsumer runs a consumer over msgs (tenant, value) where tenants
// named in failing always fail, and returns it once want holds for its
// stats. The breaker opens after 2 failures and stays open for an hour, so
// the end state is stable.
func settledConsumer(t *testing.T, msgs [][2]string, failing map[string]bool, want func(consumer.Stats) bool) *consumer.Consumer {
	t.Helper()
	c := startConsumer(t, msgs, failing)
	consumertest.Eventually(t, "the consumer's stats to settle", func() bool { return want(c.Stats()) })
	return c
}

// startConsumer runs a consumer over msgs as settledConsumer does, and
// returns it at once.
func startConsumer(t *testing.T, msgs [][2]string, failing map[string]bool) *consumer.Consumer {
	t.Helper()
	p := policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 2, OpenTimeout: time.Hour}}
	h := consumertest.NewMemHarness(1)
	c, err := consumer.New(consumer.Config{
		Scope:  scope.New(p, scope.Options[string]{}),
		Tenant: h.Tenant(),
		DLQ:    h.S,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			tn, _ := m.Header(consumertest.TenantHeader)
			if failing[string(tn)] {
				return errors.New("down")
			}
			if string(m.Value) == "bad" {
				return policy.Permanent(errors.New("bad"))
			}
			return nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		h.Produce(t, consumertest.Msg{Tenant: m[0], Value: []byte(m[1])})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h.NewSource(t)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return c
}

func TestCollectorPerTenantAndTotals(t *testing.T) {
	t.Parallel()
	msgs := [][2]string{{"acme", "1"}, {"acme", "2"}, {"acme", "bad"}, {"globex", "1"}, {"globex", "2"}, {"globex", "3"}, {"", "no tenant"}}
	c := settledConsumer(t, msgs, map[string]bool{"globex": true}, func(s consumer.Stats) bool {
		return s.Handled == 2 && s.DeadLettered == 2 && s.Parked == 3
	})
	col, err := metrics.NewCollector(c, metrics.WithConstLabels(prometheus.Labels{"group": "g"}))
	if err != nil {
		t.Fatal(err)
	}
	want := `
# HELP ringfence_tenant_handled_total Messages of the tenant handled successfully.
# TYPE ringfence_tenant_handled_total counter
ringfence_tenant_handled_total{group="g",tenant="acme"} 2
ringfence_tenant_handled_total{group="g",tenant="globex"} 0
ringfence_tenant_handled_total{group="g",tenant="` + dlq.NoTenantToken + `"} 0
ringfence_tenant_handled_total{group="g",tenant="_other"} 0
# HELP ringfence_tenant_dead_lettered_total Messages of the tenant written to its dead-letter queue.
# TYPE ringfence_tenant_dead_lettered_total counter
ringfence_tenant_dead_lettered_total{group="g",tenant="acme"} 1
ringfence_tenant_dead_lettered_total{group="g",tenant="globex"} 0
ringfence_tenant_dead_lettered_total{group="g",tenant="` + dlq.NoTenantToken + `"} 1
ringfence_tenant_dead_lettered_total{group="g",tenant="_other"} 0
# HELP ringfence_tenant_parked Messages of the tenant waiting behind its open breaker.
# TYPE ringfence_tenant_parked gauge
ringfence_tenant_parked{group="g",tenant="acme"} 0
ringfence_tenant_parked{group="g",tenant="globex"} 3
ringfence_tenant_parked{group="g",tenant="` + dlq.NoTenantToken + `"} 0
ringfence_tenant_parked{group="g",tenant="_other"} 0
# HELP ringfence_tenant_breaker_state The tenant's breaker: 0 closed, 1 half-open, 2 open.
# TYPE ringfence_tenant_breaker_state gauge
ringfence_tenant_breaker_state{group="g",tenant="acme"} 0
ringfence_tenant_breaker_state{group="g",tenant="globex"} 2
ringfence_tenant_breaker_state{group="g",tenant="` + dlq.NoTenantToken + `"} 0
ringfence_tenant_breaker_state{group="g",tenant="_other"} 0
# HELP ringfence_handled_total Messages handled successfully, all tenants.
# TYPE ringfence_handled_total counter
ringfence_handled_total{group="g"} 2
# HELP ringfence_dead_lettered_total Messages dead-lettered, all tenants.
# TYPE ringfence_dead_lettered_total counter
ringfence_dead_lettered_total{group="g"} 2
# HELP ringfence_parked Messages parked behind open breakers, all tenants.
# TYPE ringfence_parked gauge
ringfence_parked{group="g"} 3
`
	names := []string{"ringfence_tenant_handled_total", "ringfence_tenant_dead_lettered_total", "ringfence_tenant_parked",
		"ringfence_tenant_breaker_state", "ringfence_handled_total", "ringfence_dead_lettered_total", "ringfence_parked"}
	if err := testutil.CollectAndCompare(col, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	// The failed attempts of the outage: at least the two that tripped the
	// breaker, all of them globex's.
	if got := testutil.CollectAndCount(col, "ringfence_tenant_failed_total"); got != 4 {
		t.Fatalf("%d failed_total series, want 4 (3 tenants and _other)", got)
	}
	problems, err := testutil.CollectAndLint(col)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// A registry accepts it (descriptors consistent with what is collected).
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(col); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

func TestCollectorBoundsTenantSeries(t *testing.T) {
	t.Parallel()
	var msgs [][2]string
	for _, tn := range []string{"a", "b", "c", "d", "e"} {
		msgs = append(msgs, [2]string{tn, "1"})
	}
	msgs = append(msgs, [2]string{"z", "1"}, [2]string{"z", "2"}, [2]string{"z", "3"})
	c := settledConsumer(t, msgs, map[string]bool{"z": true}, func(s consumer.Stats) bool {
		return s.Handled == 5 && s.Parked == 3
	})
	col, err := metrics.NewCollector(c, metrics.WithMaxTenants(2))
	if err != nil {
		t.Fatal(err)
	}
	// The open-breaker tenant is kept first, then by key; the rest are
	// summed into _other.
	want := `
# HELP ringfence_tenant_breaker_state The tenant's breaker: 0 closed, 1 half-open, 2 open.
# TYPE ringfence_tenant_breaker_state gauge
ringfence_tenant_breaker_state{tenant="_other"} 0
ringfence_tenant_breaker_state{tenant="a"} 0
ringfence_tenant_breaker_state{tenant="z"} 2
# HELP ringfence_tenants_tracked Tenants the engine tracks now.
# TYPE ringfence_tenants_tracked gauge
ringfence_tenants_tracked 6
# HELP ringfence_tenants_exported Tenants exported with their own series in this scrape.
# TYPE ringfence_tenants_exported gauge
ringfence_tenants_exported 2
# HELP ringfence_handled_total Messages handled successfully, all tenants.
# TYPE ringfence_handled_total counter
ringfence_handled_total 5
# HELP ringfence_tenant_handled_total Messages of the tenant handled successfully.
# TYPE ringfence_tenant_handled_total counter
ringfence_tenant_handled_total{tenant="_other"} 4
ringfence_tenant_handled_total{tenant="a"} 1
ringfence_tenant_handled_total{tenant="z"} 0
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want),
		"ringfence_tenant_breaker_state", "ringfence_tenants_tracked", "ringfence_tenants_exported", "ringfence_handled_total", "ringfence_tenant_handled_total"); err != nil {
		t.Fatal(err)
	}
}

// TestCollectorDLQUnavailable: a tenant whose DLQ refuses its dead letters
// says so, per tenant and in the totals, and is kept among the tenants
// worth watching.
func TestCollectorDLQUnavailable(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	down := dlq.SinkFunc(func(context.Context, *dlq.Record) error { return errors.New("dlq unreachable") })
	c, err := consumer.New(consumer.Config{
		Tenant: h.Tenant(), DLQ: down, DLQRetry: time.Millisecond, DLQProbe: time.Millisecond,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == "bad" {
				return policy.Permanent(errors.New("bad"))
			}
			return nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []consumertest.Msg{{Tenant: "a", Value: []byte("1")}, {Tenant: "b", Value: []byte("1")}, {Tenant: "z", Value: []byte("bad")}} {
		h.Produce(t, m)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h.NewSource(t)) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	consumertest.Eventually(t, "z's DLQ to refuse its dead letter twice", func() bool {
		s := c.Stats()
		return s.Handled == 2 && s.DLQUnavailableTenants == 1 && s.DLQFailures >= 2
	})
	col, err := metrics.NewCollector(c, metrics.WithMaxTenants(1))
	if err != nil {
		t.Fatal(err)
	}
	want := `
# HELP ringfence_tenant_dlq_unavailable 1 while the tenant's dead-letter queue refuses its dead letters (its messages wait behind them), else 0 (_other: 1 if any of the rest).
# TYPE ringfence_tenant_dlq_unavailable gauge
ringfence_tenant_dlq_unavailable{tenant="_other"} 0
ringfence_tenant_dlq_unavailable{tenant="z"} 1
# HELP ringfence_dlq_unavailable_tenants Tenants whose dead-letter queue refuses their dead letters now.
# TYPE ringfence_dlq_unavailable_tenants gauge
ringfence_dlq_unavailable_tenants 1
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want), "ringfence_tenant_dlq_unavailable", "ringfence_dlq_unavailable_tenants"); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"ringfence_tenant_dlq_write_failures_total": 2, "ringfence_dlq_write_failures_total": 1} {
		if n := testutil.CollectAndCount(col, name); n != want {
			t.Errorf("%d %s series, want %d", n, name, want)
		}
	}
}

func TestCollectorTenantLabelIsAToken(t *testing.T) {
	t.Parallel()
	odd := "caf\xe9/../*" // not UTF-8, with path and wildcard characters
	c := settledConsumer(t, [][2]string{{odd, "1"}}, nil, func(s consumer.Stats) bool { return s.Handled == 1 })
	col, err := metrics.NewCollector(c)
	if err != nil {
		t.Fatal(err)
	}
	want := `
# HELP ringfence_tenant_handled_total Messages of the tenant handled successfully.
# TYPE ringfence_tenant_handled_total counter
ringfence_tenant_handled_total{tenant="_other"} 0
ringfence_tenant_handled_total{tenant="` + dlq.TenantToken(odd) + `"} 1
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want), "ringfence_tenant_handled_total"); err != nil {
		t.Fatal(err)
	}
}

func TestNewCollectorValidates(t *testing.T) {
	t.Parallel()
	if _, err := metrics.NewCollector(nil); !errors.Is(err, metrics.ErrInvalidOption) {
		t.Fatalf("nil consumer: %v", err)
	}
	h := consumertest.NewMemHarness(1)
	c, err := consumer.New(consumer.Config{Tenant: h.Tenant(), DLQ: h.S, Handler: consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil })})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opt  metrics.Option
	}{
		{"empty namespace", metrics.WithNamespace("")},
		{"zero max tenants", metrics.WithMaxTenants(0)},
		{"tenant const label", metrics.WithConstLabels(prometheus.Labels{"tenant": "x"})},
		{"nil option", nil},
	} {
		if _, err := metrics.NewCollector(c, tc.opt); !errors.Is(err, metrics.ErrInvalidOption) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	col, err := metrics.NewCollector(c, metrics.WithNamespace("app"))
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(col, "app_handled_total"); n != 1 {
		t.Fatalf("namespace: %d app_handled_total series", n)
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/fleet"
	"github.com/ringfence/ringfence/internal/kafkatest"
	"github.com/ringfence/ringfence/internal/natstest"
)

// Agent timing of the fleet tests: short, so that a stopped process ages
// out quickly; every wait on it is a bounded poll.
const (
	testInterval = 200 * time.Millisecond
	testTTL      = 2 * time.Second
)

// handled records what an engine handled, in order, per tenant.
type handled struct {
	mu sync.Mutex
	m  map[string][]string
}

func (h *handled) handler() consumer.Handler {
	return consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.m == nil {
			h.m = map[string][]string{}
		}
		h.m[string(m.Key)] = append(h.m[string(m.Key)], string(m.Value))
		return nil
	})
}

func (h *handled) of(tenant string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.m[tenant])
}

// proc is one process of a fleet test: an engine over an in-memory broker
// and its agent.
type proc struct {
	c      *consumer.Consumer
	a      *fleet.Agent
	h      *handled
	cancel context.CancelFunc
	done   chan struct{}
}

// stop stops the process without a goodbye (as a crash would) and waits
// for its engine.
func (p *proc) stop() {
	p.cancel()
	<-p.done
}

func startProc(t *testing.T, st fleet.Store, b *consumertest.Broker, process string) *proc {
	t.Helper()
	return startProcSpill(t, st, b, process, nil)
}

// startProcSpill starts a process whose engine spills to spill (nil: none).
func startProcSpill(t *testing.T, st fleet.Store, b *consumertest.Broker, process string, spill consumer.SpillLog) *proc {
	t.Helper()
	p := &proc{h: &handled{}, done: make(chan struct{})}
	c, err := consumer.New(consumer.Config{Handler: p.h.handler(), Tenant: consumer.FromKey(), DLQ: consumertest.NewSink(), Spill: spill,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	a, err := fleet.NewAgent(fleet.AgentConfig{Consumer: c, Store: st, Group: "shop", Source: "mem", Process: process,
		Interval: testInterval, TTL: testTTL, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	p.c, p.a, p.cancel = c, a, cancel
	go func() {
		defer close(p.done)
		_ = c.Run(ctx, b.Source("g"))
	}()
	t.Cleanup(func() {
		p.cancel()
		<-p.done
	})
	return p
}

// statusProcesses runs `status --json` and returns the live processes.
func statusProcesses(t *testing.T, base []string) []string {
	t.Helper()
	code, out, errs := cli(t, append([]string{"status", "--json"}, base...)...)
	if code != 0 {
		t.Fatalf("status --json exit %d: %s", code, errs)
	}
	var ps []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, `{"type":"process"`) {
			ps = append(ps, jsonLines[console.FleetProcessLine](t, line, "process")[0].Process)
		}
	}
	return ps
}

func waitProcesses(t *testing.T, base []string, want ...string) time.Duration {
	t.Helper()
	start := time.Now()
	consumertest.Eventually(t, fmt.Sprintf("status showing processes %v", want), func() bool {
		return slices.Equal(statusProcesses(t, base), want)
	})
	return time.Since(start)
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// Three processes of a group: status shows them and their partitions; a
// hold written by the CLI reaches the three engines (its latency printed
// with -v); a process stopped without a goodbye leaves the status within
// its TTL, one closed leaves it at once.
func TestFleetKafkaThreeProcesses(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.MustStart(t)
	base := []string{"--kafka", cluster.Addrs()[0], "--group", "shop"}
	if code, _, errs := cli(t, append([]string{"status"}, base...)...); code != 1 || !strings.Contains(errs, "no topic shop.ringfence-status") {
		t.Fatalf("status before any agent: exit %d, %q", code, errs)
	}
	threeProcesses(t, base, func(ctx context.Context) (fleet.Store, error) {
		return fleet.NewKafkaStore(ctx, cluster.Addrs(), "shop", fleet.KafkaOptions{Create: true})
	})
}

func TestFleetNATSThreeProcesses(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	base := []string{"--nats", srv.URL(), "--group", "shop"}
	if code, _, errs := cli(t, append([]string{"status"}, base...)...); code != 1 || !strings.Contains(errs, "no KV bucket ringfence-status-shop") {
		t.Fatalf("status before any agent: exit %d, %q", code, errs)
	}
	threeProcesses(t, base, func(ctx context.Context) (fleet.Store, error) {
		return fleet.NewNATSStore(ctx, js, "shop", fleet.NATSOptions{Create: true, TTL: testTTL})
	})
}

func threeProcesses(t *testing.T, base []string, open func(context.Context) (fleet.Store, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var procs []*proc
	for i, name := range []string{"p0", "p1", "p2"} {
		st, err := open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		b := consumertest.NewBroker(fmt.Sprintf("orders-%d", i), 2)
		b.Append(0, []byte("acme"), []byte("1"))
		procs = append(procs, startProc(t, st, b, name))
	}
	waitProcesses(t, base, "p0", "p1", "p2")
	consumertest.Eventually(t, "status showing the partition owners", func() bool {
		code, out, _ := cli(t, append([]string{"status"}, base...)...)
		return code == 0 && strings.Contains(out, "orders-2/1  p2") && strings.Contains(out, "orders-0/0  p0")
	})

	var lat, cliLat, after []time.Duration
	for i := range 20 {
		tenant := fmt.Sprintf("tenant-%d", i)
		start := time.Now()
		if code, _, errs := cli(t, append([]string{"tenant", "hold", tenant, "--reason", "latency try", "--by", "test"}, base...)...); code != 0 {
			t.Fatalf("hold: exit %d: %s", code, errs)
		}
		cliLat = append(cliLat, time.Since(start))
		consumertest.Eventually(t, tenant+" held by every engine", func() bool {
			for _, p := range procs {
				if !p.c.Controls()[tenant].Hold {
					return false
				}
			}
			return true
		})
		lat = append(lat, time.Since(start))
		after = append(after, lat[len(lat)-1]-cliLat[len(cliLat)-1])
	}
	t.Logf("%s: hold latency (CLI start to all 3 engines holding), %d tries: p50 %v, p99 %v, max %v",
		base[0][2:], len(lat), percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 1))
	t.Logf("of which the CLI command itself (connect, read the table, write): p50 %v, p99 %v; from its return to all 3 holding: p50 %v, p99 %v",
		percentile(cliLat, 0.5), percentile(cliLat, 0.99), percentile(after, 0.5), percentile(after, 0.99))

	// The held tenants are listed with their control, by every process.
	code, out, _ := cli(t, append([]string{"status", "--json"}, base...)...)
	if code != 0 || strings.Count(out, `"type":"control"`) != 20 {
		t.Fatalf("status after the holds: exit %d\n%s", code, out)
	}
	if c := procs[0].c.Controls()["tenant-3"]; c.By != "test" || c.Reason != "latency try" {
		t.Fatalf("control of tenant-3: %+v", c)
	}

	procs[2].stop()
	stopped := time.Now()
	waitProcesses(t, base, "p0", "p1")
	t.Logf("%s: a process stopped without a goodbye left the status after %v (TTL %v, heartbeat every %v)", base[0][2:], time.Since(stopped).Round(10*time.Millisecond), testTTL, testInterval)

	if err := procs[1].a.Close(); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	waitProcesses(t, base, "p0")
	t.Logf("a closed agent left the status after %v", time.Since(closed).Round(10*time.Millisecond))
	if s := procs[0].a.Stats(); s.Published == 0 || s.ControlsApplied < 21 || s.LastError != "" {
		t.Fatalf("agent stats %+v", s)
	}
}

// The CLI's errors: unknown command, missing reason, bad token, bad
// numbers, and a table that is not ringfence's.
func TestFleetCLIErrors(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	base := []string{"--nats", srv.URL(), "--group", "shop"}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"tenant", "freeze", "a", "--reason", "x"}, 2, `unknown command "freeze"`},
		{[]string{"tenant", "hold", "a"}, 2, "--reason TEXT is required"},
		{[]string{"tenant", "hold", "--reason", "x"}, 2, "TENANT (or --tenant-token TOKEN) is required"},
		{[]string{"tenant", "hold", "--tenant-token", "a_zz", "--reason", "x"}, 2, "invalid tenant token"},
		{[]string{"tenant", "weight", "x", "a", "--reason", "x"}, 2, "want a number"},
		{[]string{"tenant", "hold", "a", "b", "--reason", "x"}, 2, `unexpected argument "b"`},
		{[]string{"status", "--kafka", "h:1", "--nats", "n"}, 2, "one of them"},
		{[]string{"status", "--nats", "nats://127.0.0.1:1"}, 2, "--group GROUP is required"},
	} {
		args := tc.args
		if !slices.Contains(args, "--kafka") && !slices.Contains(args, "--nats") {
			args = append(slices.Clone(args), base...)
		}
		code, _, errs := cli(t, args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
	// A bucket under the control table's name that is not ringfence's.
	_, js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := fleet.NewNATSStore(ctx, js, "other", fleet.NATSOptions{Create: true}); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, fleet.NATSBucket("other", fleet.KindControl)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstreamKV(fleet.NATSBucket("other", fleet.KindControl))); err != nil {
		t.Fatal(err)
	}
	code, _, errs := cli(t, "tenant", "hold", "a", "--reason", "x", "--nats", srv.URL(), "--group", "other")
	if code != 1 || !strings.Contains(errs, "not a ringfence fleet table") {
		t.Fatalf("hold on a foreign bucket: exit %d, %q", code, errs)
	}
}

func jetstreamKV(bucket string) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: bucket}
}

// `ringfence console --group` serves the fleet page: its JSON is
// `status --json`'s, and its control POST (with the token) writes what
// `tenant` would.
func TestFleetConsole(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := rfnats.NewDLQ(ctx, js); err != nil {
		t.Fatal(err)
	}
	base := []string{"--nats", srv.URL(), "--group", "shop"}
	if code, _, errs := cli(t, append([]string{"tenant", "quarantine", "acme", "--reason", "suspect payloads", "--by", "ops"}, base...)...); code != 0 {
		t.Fatalf("quarantine: exit %d: %s", code, errs)
	}
	st, err := fleet.NewNATSStore(ctx, js, "shop", fleet.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := fleet.PublishStatus(ctx, st, fleet.Status{Process: "p1", Group: "shop", TTL: time.Minute, UpdatedAt: time.Now(),
		Partitions: []string{"orders/0"}, Tenants: []fleet.TenantStatus{{Tenant: "acme", State: "closed", Held: true, Control: &fleet.Control{Quarantine: true}}}}); err != nil {
		t.Fatal(err)
	}
	u := startConsole(t, "--nats", srv.URL(), "--stream", rfnats.DefaultDLQStream, "--group", "shop", "--token", "fleet-token-0123456789")
	code, page := httpDo(t, "GET", u+"fleet?format=json", nil, nil)
	_, out, _ := cli(t, append([]string{"status", "--json"}, base...)...)
	if code != http.StatusOK || page != out || !strings.Contains(out, `"suspect payloads"`) {
		t.Fatalf("console /fleet (%d):\n%s\nstatus --json:\n%s", code, page, out)
	}
	code, body := httpDo(t, "POST", u+"fleet/control", url.Values{"verb": {"unquarantine"}, "tenant": {"acme"}, "reason": {"checked"}},
		map[string]string{"Authorization": "Bearer fleet-token-0123456789", "Accept": "application/json"})
	if code != http.StatusOK {
		t.Fatalf("control POST: %d %s", code, body)
	}
	cs, err := fleet.ReadControls(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := cs["acme"]; r.Active() || r.Reason != "checked" {
		t.Fatalf("control after unquarantine: %+v", r)
	}
}

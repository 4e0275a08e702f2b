package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

func TestMain(m *testing.M) {
	// The kafka and nats brokers run in a child process: this binary.
	if code, ok := ServeChild(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func TestFlags(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	for _, bad := range [][]string{
		{"--broker", "rabbit"},
		{"--broker", "memory", "--tenants", "2"},
		{"--scenario", "flood"},
		{"--policy", "strict"},
		{"--heap-budget", "lots"},
		{"--broker", "memory", "--scenario", "slow", "--duration", "10s", "--fault", "20s"},
		{"extra"},
	} {
		errb.Reset()
		if code := Main(bad, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, stderr %q", bad, code, errb.String())
		}
	}
	errb.Reset()
	if code := Main([]string{"--help"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "-tenants") || !strings.Contains(errb.String(), "long-outage") {
		t.Fatalf("help: exit %d, stderr %q", code, errb.String())
	}
	o, err := parseFlags([]string{"--broker", "kafka", "--kafka", "127.0.0.1:9092", "--tenants", "30", "--duration", "5s", "--json"}, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Brokers) != 1 || o.Brokers[0] != "kafka" || o.KafkaAddr != "127.0.0.1:9092" || o.Scenario.Tenants != 30 || o.Scenario.Duration != 5*time.Second || !o.JSON {
		t.Fatalf("parsed %+v", o)
	}
	o, err = parseFlags(nil, &errb)
	if err != nil || strings.Join(o.Brokers, ",") != "kafka,nats" || o.Scenario.Kind != KindOutage || o.Modes != nil || o.LagBound != LongOutageMaxLag {
		t.Fatalf("defaults %+v, %v", o, err)
	}
	o, err = parseFlags([]string{"--scenario", "long-outage", "--outage", "1m", "--shared", "--policy", "default", "--heap-budget", "64MiB", "--lag-bound", "500", "--partitions", "8"}, &errb)
	if err != nil {
		t.Fatal(err)
	}
	sc := o.Scenario.withDefaults()
	if sc.Kind != KindLongOutage || sc.Fault != time.Minute || sc.Duration != 90*time.Second || sc.PolicyName != "default" || sc.Partitions != 8 ||
		len(o.Modes) != 3 || o.HeapBudget != 64<<20 || o.LagBound != 500 {
		t.Fatalf("parsed %+v (scenario %+v)", o, sc)
	}
	o, err = parseFlags([]string{"--scenario", "outage", "--shared=false"}, &errb)
	if err != nil || len(o.Modes) != 2 || o.Modes[1] != PerTenant {
		t.Fatalf("--shared=false: modes %v, %v", o.Modes, err)
	}
	if o.Scenario.Instant || o.Scenario.withDefaults().Latency != time.Millisecond {
		t.Fatalf("default latency: instant %v, latency %v; want 1ms calls", o.Scenario.Instant, o.Scenario.withDefaults().Latency)
	}
	for in, want := range map[string]Scenario{"0": {Instant: true}, "5ms": {Latency: 5 * time.Millisecond}} {
		o, err = parseFlags([]string{"--scenario", "hang", "--latency", in}, &errb)
		if err != nil || o.Scenario.Instant != want.Instant || o.Scenario.Latency != want.Latency {
			t.Fatalf("--latency %s: instant %v, latency %v, %v", in, o.Scenario.Instant, o.Scenario.Latency, err)
		}
	}
}

func TestParseSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]uint64{"1024": 1024, "64MiB": 64 << 20, "2G": 2 << 30, "512KiB": 512 << 10, "10B": 10} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "0", "1.5GiB", "9999999999GiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}

// shortScenario runs in a few seconds: few tenants, 2s of traffic, short
// waits. With 6 tenants on 2 partitions the bad tenant
// (tenant-02) shares partition 0 with tenant-04 (the poison tenant of the
// outage scenario) and tenant-06.
func shortScenario(k Kind) Scenario {
	return Scenario{
		Kind: k, Tenants: 6, Rate: 20, Duration: 2 * time.Second, Fault: time.Second, Partitions: 2,
		HotFactor: 5, SlowLatency: 100 * time.Millisecond,
		Settle: time.Second, Drain: 20 * time.Second, Stall: 3 * time.Second, ReadBack: 5 * time.Second,
		ShutdownTimeout: time.Second,
	}
}

// checkRuns asserts what must hold whatever the engine and the machine's
// speed: nothing lost, no dead letter of a healthy tenant or of the bad one
// (a fault is not the message's fault), every poison message
// dead-lettered, the bad tenant's messages in order, every message on the
// partition its key hashes to, and the accounting adds up.
func checkRuns(t *testing.T, r *BrokerResult) {
	t.Helper()
	for _, m := range Modes {
		run := r.Runs[m]
		if !run.Ran {
			continue
		}
		if run.Lost != 0 {
			t.Errorf("%s %s %s: %d lost", r.Broker, r.Sc.Kind, m, run.Lost)
		}
		if run.PoisonDead != r.Sent {
			t.Errorf("%s %s %s: %d of %d poison messages dead-lettered", r.Broker, r.Sc.Kind, m, run.PoisonDead, r.Sent)
		}
		if run.OtherDead != 0 {
			t.Errorf("%s %s %s: %d dead letters of healthy tenants", r.Broker, r.Sc.Kind, m, run.OtherDead)
		}
		if run.PartitionMismatches != 0 {
			t.Errorf("%s %s %s: %d messages off their key's partition", r.Broker, r.Sc.Kind, m, run.PartitionMismatches)
		}
		if run.Recovered > run.UnfinishedAfterDrain || run.UnfinishedAfterDrain > run.UnfinishedAtDeadline+run.Produced {
			t.Errorf("%s %s %s: accounting %d unfinished at deadline, %d after drain, %d found by restart", r.Broker, r.Sc.Kind, m,
				run.UnfinishedAtDeadline, run.UnfinishedAfterDrain, run.Recovered)
		}
		if m != Shared && run.BadOutOfOrder != 0 {
			t.Errorf("%s %s %s: %d of %d messages of %s out of order", r.Broker, r.Sc.Kind, m, run.BadOutOfOrder, run.BadInOrder, r.Bad)
		}
		if run.LagSamples == 0 || run.HealthyN == 0 {
			t.Errorf("%s %s %s: %d lag samples, %d latencies", r.Broker, r.Sc.Kind, m, run.LagSamples, run.HealthyN)
		}
	}
	pt, bl := r.Runs[PerTenant], r.Runs[Baseline]
	switch {
	case r.Sc.Kind.poisons():
		// Every poison message of the burst, and nothing else.
		if pt.BurstPoison == 0 || pt.BurstDead != pt.BurstPoison || pt.BadDead != pt.BurstPoison || pt.GoodDead != 0 || bl.BadDead != 0 {
			t.Errorf("%s %s: %d of %d poison messages dead-lettered, %s %d in all, %d good (baseline %d)",
				r.Broker, r.Sc.Kind, pt.BurstDead, pt.BurstPoison, r.Bad, pt.BadDead, pt.GoodDead, bl.BadDead)
		}
		for _, tr := range pt.Tenants {
			if tr.Tenant == r.Bad && tr.Trips != 0 {
				t.Errorf("%s %s: permanent failures tripped %s's breaker %d times", r.Broker, r.Sc.Kind, r.Bad, tr.Trips)
			}
		}
	case pt.BadDead != 0 || bl.BadDead != 0:
		t.Errorf("%s %s: %s dead-lettered %d (baseline %d)", r.Broker, r.Sc.Kind, r.Bad, pt.BadDead, bl.BadDead)
	}
	// The baseline has no fault: a tenant parks in it only behind a breaker
	// that a stall tripped (a slow call, or a call past the Deadline), which
	// only a machine that stalls the handler's millisecond calls past the
	// slow-call threshold (100ms at least) brings about. The poison tenant
	// is left out: its poison messages fail as an outage would until the
	// message behind one convicts it, and their retries may trip its
	// breaker, and park it, in any run.
	stalls, parked := 0, 0
	for _, tr := range bl.Tenants {
		if tr.Role == "poison" {
			continue
		}
		stalls += tr.StallTrips
		parked = max(parked, tr.MaxParked)
		if tr.Trips != tr.StallTrips || tr.StallTrips == 0 && (tr.MaxParked != 0 || tr.Tenant == r.Bad && bl.BadParked != 0) {
			t.Errorf("%s %s baseline: %s tripped %d times (%d on a stall), %d parked at most (%s parked %d times)",
				r.Broker, r.Sc.Kind, tr.Tenant, tr.Trips, tr.StallTrips, tr.MaxParked, r.Bad, bl.BadParked)
		}
	}
	if parked != 0 && stalls == 0 {
		t.Errorf("%s %s baseline: %d parked at most, and no breaker tripped on a stall", r.Broker, r.Sc.Kind, parked)
	}
	if stalls > 0 {
		t.Logf("%s %s baseline: %d breaker trips on stalls (the machine stalled the handler's calls), %d parked at most", r.Broker, r.Sc.Kind, stalls, parked)
	}
	if r.Sc.Kind.fails() {
		// A failing dependency must trip the bad tenant's breaker and park
		// it, and no healthy tenant's (but on a stall, as in the baseline).
		for _, tr := range pt.Tenants {
			switch {
			case tr.Tenant == r.Bad && (tr.Trips < 1 || tr.MaxParked < 1 || pt.BadParked < 1):
				t.Errorf("%s: %s tripped %d times, parked %d times, at most %d", r.Broker, r.Bad, tr.Trips, pt.BadParked, tr.MaxParked)
			case tr.Role == "" && (tr.Trips != tr.StallTrips || tr.StallTrips == 0 && tr.MaxParked != 0):
				t.Errorf("%s: healthy %s tripped %d times (%d on a stall), parked %d", r.Broker, tr.Tenant, tr.Trips, tr.StallTrips, tr.MaxParked)
			}
		}
	}
	if r.Sc.Kind == KindHot && pt.Produced <= bl.Produced {
		t.Errorf("%s hot: the ringfence run produced %d, the baseline %d: no burst", r.Broker, pt.Produced, bl.Produced)
	}
	t.Logf("%s %s: goodput %.2f (mates %.2f), p99 %s/%s, lag %d, parked %d, unfinished %d/%d, found again %d",
		r.Broker, r.Sc.Kind, ratio(pt.HealthyGoodput, bl.HealthyGoodput), ratio(pt.MatesGoodput, bl.MatesGoodput),
		fmtLatency(pt.HealthyP99), fmtLatency(bl.HealthyP99), pt.MaxLagFault, pt.BadParked, pt.UnfinishedAtDeadline, pt.UnfinishedAfterDrain, pt.Recovered)
}

// TestRunMemory runs every scenario, scaled down, on the in-memory broker.
func TestRunMemory(t *testing.T) {
	t.Parallel()
	for _, k := range Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			var out, progress bytes.Buffer
			res, err := Run(context.Background(), Options{Brokers: []string{"memory"}, Scenario: shortScenario(k), Stdout: &out, Progress: &progress})
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 1 {
				t.Fatalf("%d results", len(res))
			}
			r := res[0]
			mates := "tenant-04, tenant-06" // the outage scenario's poison tenant is not healthy
			if k == KindOutage {
				mates = "tenant-06"
			}
			if strings.Join(r.Mates, ", ") != mates || r.Bad != "tenant-02" || !r.Keyed || r.BadPartition != 0 {
				t.Fatalf("bad %s on %d, mates %v", r.Bad, r.BadPartition, r.Mates)
			}
			if r.Runs[Shared].Ran != (k == KindOutage) {
				t.Errorf("shared run: %v", r.Runs[Shared].Ran)
			}
			checkRuns(t, r)
			for _, want := range []string{"tenant-02", "scenario " + string(k), "ratio to baseline", "partition-mates of tenant-02 (partition 0): " + mates,
				"p99", "commit lag", "unfinished at deadline", "lost", "checks (ringfence run)"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("summary lacks %q:\n%s", want, out.String())
				}
			}
			if !strings.Contains(progress.String(), "memory baseline") || !strings.Contains(progress.String(), "done in") {
				t.Errorf("progress lines:\n%s", progress.String())
			}
		})
	}
}

// TestTripCounter: a run counts each breaker opening of a key, and tells
// the openings a stall caused (a slow call, a call past the Deadline), as
// a real guard reports them.
func TestTripCounter(t *testing.T) {
	t.Parallel()
	type trip struct {
		key     string
		stalled bool
	}
	var got []trip
	s := scope.New(policy.Policy{
		Breaker:  &policy.Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Hour, SlowCall: policy.SlowCall{Threshold: time.Millisecond}},
		Retry:    policy.Retry{MaxAttempts: 1},
		Deadline: 10 * time.Millisecond,
	}, scope.Options[string]{OnEvent: tripCounter(func(key string, stalled bool) { got = append(got, trip{key, stalled}) })})
	ctx := context.Background()
	_ = s.For("slow").Run(ctx, func(context.Context) error { time.Sleep(5 * time.Millisecond); return nil })
	_ = s.For("late").Run(ctx, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	_ = s.For("failing").Run(ctx, func(context.Context) error { return errors.New("down") })
	if want := []trip{{"slow", true}, {"late", true}, {"failing", false}}; !slices.Equal(got, want) {
		t.Fatalf("trips %v, want %v", got, want)
	}
}

func TestMainJSON(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	code := Main([]string{"--broker", "memory", "--json", "--tenants", "5", "--duration", "1s"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		n++
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		for _, k := range []string{"broker", "healthy_ratio_per_tenant", "healthy_ratio_shared", "transient_dead_lettered", "poison_dead_lettered", "lost",
			"scenario", "partition_mates", "runs", "checks", "ok", "commit_lag_measure"} {
			if _, ok := m[k]; !ok {
				t.Errorf("JSON lacks %q: %s", k, sc.Text())
			}
		}
		if m["broker"] != "memory" || m["lost"] != 0.0 || m["transient_dead_lettered"] != 0.0 || m["scenario"] != "outage" {
			t.Errorf("JSON %s", sc.Text())
		}
		runs := m["runs"].(map[string]any)
		for _, mode := range []string{"baseline", "ringfence", "shared"} {
			r, ok := runs[mode].(map[string]any)
			if !ok {
				t.Fatalf("no %s run in %s", mode, sc.Text())
			}
			for _, k := range []string{"healthy_goodput_ratio", "mates_goodput_ratio", "healthy_p99_ms", "mates_p99_ratio", "max_commit_lag_fault",
				"consumer_heap_bytes", "bad_parked_events", "bad_dead_lettered", "bad_out_of_order", "unfinished_at_deadline",
				"unfinished_after_drain", "recovered_on_restart", "lost"} {
				if _, ok := r[k]; !ok {
					t.Errorf("%s run lacks %q", mode, k)
				}
			}
		}
	}
	if n != 1 {
		t.Fatalf("%d JSON lines, want 1:\n%s", n, out.String())
	}
}

func TestView(t *testing.T) {
	t.Parallel()
	s := Snapshot{
		Broker: "kafka", Kind: KindOutage, Mode: PerTenant, Elapsed: 2500 * time.Millisecond, Duration: 8 * time.Second, FaultOn: true, Producing: true,
		Rows: []Row{
			{Tenant: "tenant-01", Handled: 10, TrackedAlone: true},
			{Tenant: "tenant-07", Role: "outage", Handled: 3, Backlog: 40, Parked: 40, State: policy.Open, TrackedAlone: true},
		},
		Handled: 13, Backlog: 40, Parked: 40,
	}
	if got := plainLine(s); !strings.Contains(got, "OUTAGE") || !strings.Contains(got, "tenant-07:open") || !strings.Contains(got, "parked=40") {
		t.Fatalf("plain line %q", got)
	}
	hot := s
	hot.Kind = KindHot
	if got := plainLine(hot); !strings.Contains(got, " HOT ") {
		t.Fatalf("plain line %q", got)
	}
	var b bytes.Buffer
	v := newView(&b, true)
	v.Observe(s)
	first := b.String()
	if strings.Count(first, "\x1b[K\n") != 5 {
		t.Fatalf("want 5 cleared lines: %q", first)
	}
	if !strings.Contains(first, "tenant-07") || !strings.Contains(first, "open") {
		t.Fatalf("tty view:\n%s", first)
	}
	b.Reset()
	v.Observe(s)
	// Title, column names, 2 rows and the total: 5 lines to go back over.
	if !strings.HasPrefix(b.String(), "\x1b[5F") {
		t.Fatalf("second draw does not move back over the first: %q", b.String()[:10])
	}
}

func TestRunRealBrokers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Kafka (kfake) and NATS in child processes")
	}
	for _, name := range []string{"kafka", "nats"} {
		kinds := []Kind{KindOutage}
		if name == "kafka" {
			// On today's engine the hanging calls leave messages
			// unfinished: the restart read-back must find them in the
			// group (NATS would take its 30s AckWait to hand them over).
			kinds = append(kinds, KindHang)
		}
		for _, k := range kinds {
			t.Run(name+"/"+string(k), func(t *testing.T) {
				t.Parallel()
				var out bytes.Buffer
				res, err := Run(context.Background(), Options{Brokers: []string{name}, Scenario: shortScenario(k), Stdout: &out})
				if err != nil {
					t.Fatal(err)
				}
				r := res[0]
				if r.Where != "child process" {
					t.Errorf("broker ran in %q", r.Where)
				}
				healthy := 5 // all but the bad tenant, and the poison one of the outage
				if k == KindOutage {
					healthy = 4
				}
				if name == "nats" && (r.Keyed || len(r.Mates) != healthy) {
					t.Errorf("nats: keyed %v, mates %v (want every healthy tenant)", r.Keyed, r.Mates)
				}
				checkRuns(t, r)
			})
		}
	}
}

func TestServeChild(t *testing.T) {
	t.Parallel()
	var stopped atomic.Bool
	servers := map[string]func() (string, func(), error){
		"fake": func() (string, func(), error) { return "127.0.0.1:1", func() { stopped.Store(true) }, nil },
	}
	var out, errb bytes.Buffer
	if code := serveChild("fake", servers, strings.NewReader(""), &out, &errb); code != 0 || out.String() != childReady+" 127.0.0.1:1\n" || !stopped.Load() {
		t.Fatalf("exit %d, out %q, stderr %q, stopped %v", code, out.String(), errb.String(), stopped.Load())
	}
	if code := serveChild("rabbit", servers, strings.NewReader(""), &out, &errb); code != 2 || !strings.Contains(errb.String(), "names no broker") {
		t.Fatalf("unknown broker: exit %d, stderr %q", code, errb.String())
	}
}

func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	srv, register, err := serveMetrics("127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	topic, _ := memBroker{}.Open(context.Background(), "m", 1)
	c, err := consumer.New(consumer.Config{Tenant: topic.Tenant(), DLQ: topic.Sink(), Handler: consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil })})
	if err != nil {
		t.Fatal(err)
	}
	get := func() string {
		resp, err := http.Get("http://" + srv.Addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	unregister := register(c, "memory", PerTenant)
	if body := get(); !strings.Contains(body, `ringfence_handled_total{broker="memory",run="ringfence"} 0`) {
		t.Fatalf("metrics while registered:\n%s", body)
	}
	unregister()
	if body := get(); strings.Contains(body, "ringfence_handled_total") {
		t.Fatal("collector still exported after the run")
	}
}

// TestRunMemoryTraces prints the bad tenant's traces after the ringfence
// run: a message that failed and parked, as a tree of its process span.
func TestRunMemoryTraces(t *testing.T) {
	t.Parallel()
	o, err := parseFlags([]string{"--broker", "memory", "--traces", "2"}, io.Discard)
	if err != nil || o.Traces != 2 {
		t.Fatalf("--traces 2: %+v, %v", o.Traces, err)
	}
	var out bytes.Buffer
	_, err = Run(context.Background(), Options{Brokers: []string{"memory"}, Scenario: shortScenario(KindOutage), Traces: 1,
		Modes: []Mode{Baseline, PerTenant}, Stdout: &out, Progress: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	i := strings.Index(s, "Traces (memory, bad tenant, 1 of ")
	if i < 0 {
		t.Fatalf("no traces printed:\n%s", s)
	}
	tree := s[i:]
	for _, want := range []string{"process ", "[consumer]", "ringfence.tenant=tenant-02", "· attempt ringfence.attempt=1 ringfence.error=", "· park "} {
		if !strings.Contains(tree, want) {
			t.Errorf("trace lacks %q:\n%s", want, tree)
		}
	}
	if strings.Count(s, "Traces (") != 1 {
		t.Errorf("traces printed %d times, want once (the ringfence run's)", strings.Count(s, "Traces ("))
	}
}

package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/policy"
)

func TestValueRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tenant string
		id     int
		kind   byte
	}{
		{"tenant-01", 0, kindOK},
		{"tenant-13", 123456, kindPoison},
		{"a|b", 7, kindOK}, // a '|' in the tenant: the id and kind are read from the end
	} {
		v := encodeValue(tc.tenant, tc.id, tc.kind)
		tenant, id, kind, ok := decodeValue(v)
		if tc.tenant == "a|b" {
			// Tenants with '|' are not produced by the demo; decoding must
			// fail closed rather than misattribute.
			if ok && tenant == tc.tenant {
				t.Fatalf("decode(%q) accepted an ambiguous tenant", v)
			}
			continue
		}
		if !ok || tenant != tc.tenant || id != tc.id || kind != tc.kind {
			t.Fatalf("decode(%q) = %q, %d, %c, %v", v, tenant, id, kind, ok)
		}
	}
	for _, bad := range []string{"", "|", "t|1", "t||o", "t|-1|o", "t|x|o", "|1|o", "t|1|oo", "t|1|x", "0|0|\x8d"} {
		if _, _, _, ok := decodeValue([]byte(bad)); ok {
			t.Errorf("decode(%q) accepted", bad)
		}
	}
}

func FuzzDecodeValue(f *testing.F) {
	f.Add([]byte("tenant-01|12|o"))
	f.Add([]byte("x|0|p"))
	f.Add([]byte("|||"))
	f.Fuzz(func(t *testing.T, v []byte) {
		tenant, id, kind, ok := decodeValue(v)
		if !ok {
			return
		}
		if id < 0 || tenant == "" {
			t.Fatalf("decode(%q) = %q, %d", v, tenant, id)
		}
		// Whatever was accepted re-encodes to a value that decodes the same.
		t2, id2, k2, ok2 := decodeValue(encodeValue(tenant, id, kind))
		if !ok2 || t2 != tenant || id2 != id || k2 != kind {
			t.Fatalf("decode(%q) = %q %d %c; re-encoded decodes to %q %d %c %v", v, tenant, id, kind, t2, id2, k2, ok2)
		}
	})
}

func TestPlan(t *testing.T) {
	t.Parallel()
	sc := Scenario{Tenants: 20, Rate: 25, Duration: 8 * time.Second}.withDefaults()
	p := newPlan(sc)
	if p.tenants[p.outage] != "tenant-07" || p.tenants[p.poison] != "tenant-13" {
		t.Fatalf("outage %s, poison %s", p.tenants[p.outage], p.tenants[p.poison])
	}
	perT := make([]int, sc.Tenants)
	lastKind := make([]byte, sc.Tenants)
	for id := range p.total {
		if id > 0 && p.due[id] < p.due[id-1] {
			t.Fatalf("id %d due %v before id %d at %v", id, p.due[id], id-1, p.due[id-1])
		}
		tn := p.owner[id]
		perT[tn]++
		if p.kinds[id] == kindPoison {
			if tn != p.poison {
				t.Fatalf("poison message %d of %s", id, p.tenants[tn])
			}
			if lastKind[tn] == kindPoison {
				t.Fatalf("two poison messages in a row at %d", id)
			}
		}
		lastKind[tn] = p.kinds[id]
	}
	if lastKind[p.poison] == kindPoison {
		t.Fatal("the poison tenant's last message is poison")
	}
	if perT[0] != 200 || perT[p.outage] != 800 {
		t.Fatalf("per-tenant counts %v (want 200 each, 800 for the outage tenant)", perT)
	}
	if got := p.poisonCount(); got != 10 {
		t.Fatalf("poison count %d, want 10", got)
	}
	if due := p.due[p.total-1]; due >= sc.Duration+time.Second/time.Duration(sc.Rate) {
		t.Fatalf("last message due at %v, past the duration", due)
	}
}

func TestScenarioValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sc   Scenario
	}{
		{"too few tenants", Scenario{Tenants: 2}},
		{"zero rate", Scenario{Rate: -1}},
		{"short duration", Scenario{Duration: time.Millisecond}},
		{"window outside", Scenario{Duration: 2 * time.Second, FaultStart: time.Second, FaultEnd: 3 * time.Second}},
		{"poison every 1", Scenario{PoisonEvery: 1}},
	} {
		if err := tc.sc.withDefaults().validate(); err == nil {
			t.Errorf("%s: validate accepted %+v", tc.name, tc.sc)
		}
	}
	if err := (Scenario{}).withDefaults().validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func TestFlags(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if code := Main([]string{"--broker", "rabbit"}, &out, &errb); code != 2 {
		t.Fatalf("bad broker: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := Main([]string{"--help"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "--tenants") && !strings.Contains(errb.String(), "-tenants") {
		t.Fatalf("help: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := Main([]string{"--broker", "memory", "--tenants", "2"}, &out, &errb); code != 2 {
		t.Fatalf("2 tenants: exit %d, stderr %q", code, errb.String())
	}
	o, err := parseFlags([]string{"--broker", "kafka", "--kafka", "127.0.0.1:9092", "--tenants", "30", "--duration", "5s", "--json"}, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Brokers) != 1 || o.Brokers[0] != "kafka" || o.KafkaAddr != "127.0.0.1:9092" || o.Scenario.Tenants != 30 || o.Scenario.Duration != 5*time.Second || !o.JSON {
		t.Fatalf("parsed %+v", o)
	}
	o, err = parseFlags(nil, &errb)
	if err != nil || strings.Join(o.Brokers, ",") != "kafka,nats" {
		t.Fatalf("default brokers %v, %v", o.Brokers, err)
	}
}

// shortScenario runs in a few seconds: few tenants, a 2s window of traffic.
func shortScenario() Scenario {
	return Scenario{Tenants: 6, Rate: 20, Duration: 2500 * time.Millisecond, Partitions: 2}
}

// checkRuns asserts what must hold whatever the machine's speed: nothing
// lost, the outage dead-letters nothing under per-tenant guards and trips
// the outage tenant's breaker, and every poison message is dead-lettered.
func checkRuns(t *testing.T, r *BrokerResult) {
	t.Helper()
	for _, m := range Modes {
		run := r.Runs[m]
		if run.Lost != 0 {
			t.Errorf("%s %s: %d lost", r.Broker, m, run.Lost)
		}
		if run.PoisonDead != r.Sent {
			t.Errorf("%s %s: %d of %d poison messages dead-lettered", r.Broker, m, run.PoisonDead, r.Sent)
		}
		if run.OtherDead != 0 {
			t.Errorf("%s %s: %d dead letters of healthy tenants", r.Broker, m, run.OtherDead)
		}
	}
	pt := r.Runs[PerTenant]
	if pt.OutageDead != 0 {
		t.Errorf("%s: per-tenant guards dead-lettered %d messages of the outage", r.Broker, pt.OutageDead)
	}
	for _, tr := range pt.Tenants {
		switch tr.Role {
		case "outage":
			if tr.Trips < 1 || tr.MaxParked < 1 {
				t.Errorf("%s: outage tenant tripped %d times, parked at most %d", r.Broker, tr.Trips, tr.MaxParked)
			}
		case "":
			if tr.Trips != 0 || tr.MaxParked != 0 {
				t.Errorf("%s: healthy %s tripped %d times, parked %d", r.Broker, tr.Tenant, tr.Trips, tr.MaxParked)
			}
		}
	}
	if b := r.Runs[Baseline]; b.OutageDead != 0 || b.MaxParked != 0 {
		t.Errorf("%s baseline: %d outage dead letters, %d parked", r.Broker, b.OutageDead, b.MaxParked)
	}
	t.Logf("%s: healthy ratio per tenant %.2f, shared %.2f; shared outage dead letters %d", r.Broker, r.Ratio(PerTenant), r.Ratio(Shared), r.Runs[Shared].OutageDead)
}

func TestRunMemory(t *testing.T) {
	t.Parallel()
	var out, progress bytes.Buffer
	res, err := Run(context.Background(), Options{Brokers: []string{"memory"}, Scenario: shortScenario(), Stdout: &out, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 {
		t.Fatalf("%d results", len(res))
	}
	checkRuns(t, res[0])
	for _, want := range []string{"tenant-03", "outage", "poison", "ratio to baseline", "shared breaker", "goodput during the outage"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(progress.String(), "memory baseline") || !strings.Contains(progress.String(), "done in") {
		t.Errorf("progress lines:\n%s", progress.String())
	}
}

func TestMainJSON(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	code := Main([]string{"--broker", "memory", "--json", "--tenants", "5", "--duration", "2s"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	sc := bufio.NewScanner(&out)
	n := 0
	for sc.Scan() {
		n++
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		for _, k := range []string{"broker", "healthy_ratio_per_tenant", "healthy_ratio_shared", "transient_dead_lettered", "poison_dead_lettered", "lost"} {
			if _, ok := m[k]; !ok {
				t.Errorf("JSON lacks %q: %s", k, sc.Text())
			}
		}
		if m["broker"] != "memory" || m["lost"] != 0.0 || m["transient_dead_lettered"] != 0.0 {
			t.Errorf("JSON %s", sc.Text())
		}
	}
	if n != 1 {
		t.Fatalf("%d JSON lines, want 1:\n%s", n, out.String())
	}
}

func TestView(t *testing.T) {
	t.Parallel()
	s := Snapshot{
		Broker: "kafka", Mode: PerTenant, Elapsed: 2500 * time.Millisecond, Duration: 8 * time.Second, FaultOn: true, Producing: true,
		Rows: []Row{
			{Tenant: "tenant-01", Handled: 10, TrackedAlone: true},
			{Tenant: "tenant-07", Role: "outage", Handled: 3, Backlog: 40, Parked: 40, State: policy.Open, TrackedAlone: true},
		},
		Handled: 13, Backlog: 40, Parked: 40,
	}
	if got := plainLine(s); !strings.Contains(got, "OUTAGE") || !strings.Contains(got, "tenant-07:open") || !strings.Contains(got, "parked=40") {
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
		t.Skip("starts in-process Kafka and NATS")
	}
	for _, name := range []string{"kafka", "nats"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			res, err := Run(context.Background(), Options{Brokers: []string{name}, Scenario: shortScenario(), Stdout: &out})
			if err != nil {
				t.Fatal(err)
			}
			checkRuns(t, res[0])
		})
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

package demo

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// result is a BrokerResult of kind whose ringfence run equals its baseline
// (so every check passes) until a test changes it.
func result(k Kind) *BrokerResult {
	base := RunResult{Mode: Baseline, Ran: true, figures: figures{
		Produced: 1000, HealthyGoodput: 400, MatesGoodput: 100,
		HealthyP99: 10 * ms, MatesP99: 10 * ms, HealthyN: 400, MatesN: 100,
		MaxLagFault: 12, MaxLagRun: 12, LagSamples: 20, BadInOrder: 50,
	}}
	base.BadAfterP99, base.BadAfterN = 10*ms, 50
	pt := base
	pt.Mode = PerTenant
	if k == KindSlow || k == KindHang {
		pt.BadParked = 1
	}
	sc := Scenario{Kind: k}.withDefaults()
	if k.poisons() {
		pt.BadDead, pt.BurstPoison, pt.BurstDead = 3000, 3000, 3000
		pt.BurstFirstAfter, pt.BurstLastDead = sc.FaultEnd+500*ms, sc.FaultEnd+2*time.Second
	}
	b := &BrokerResult{
		Broker: "kafka", Sc: sc, Bad: "tenant-07", Keyed: true,
		Mates: []string{"tenant-01"}, LagBound: 2000,
	}
	b.Runs[Baseline], b.Runs[PerTenant] = base, pt
	return b
}

// failing returns the names of the failed checks of b.
func failing(b *BrokerResult) []string {
	var out []string
	for _, c := range b.Checks() {
		if !c.OK {
			out = append(out, c.Name)
		}
	}
	return out
}

func checkNames(b *BrokerResult) string {
	var names []string
	for _, c := range b.Checks() {
		names = append(names, c.Name)
	}
	return strings.Join(names, "; ")
}

func TestChecksPerScenario(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind    Kind
		has     []string
		hasNot  []string
		breakIt func(r *RunResult)
		fails   string
	}{
		{KindOutage, []string{"healthy goodput", "partition-mates goodput", "tenant-07 dead-lettered", "lost (ringfence run)", "unfinished after the drain", "out of produce order"},
			[]string{"p99", "commit lag", "parked"},
			func(r *RunResult) { r.HealthyGoodput = 379 }, "healthy goodput during the fault / baseline"},
		{KindOutage, nil, nil, func(r *RunResult) { r.MatesGoodput = 94 }, "partition-mates goodput during the fault / baseline"},
		{KindOutage, nil, nil, func(r *RunResult) { r.Lost = 1 }, "lost (ringfence run)"},
		{KindOutage, nil, nil, func(r *RunResult) { r.BadDead = 1 }, "tenant-07 dead-lettered"},
		{KindOutage, nil, nil, func(r *RunResult) { r.BadOutOfOrder = 1 }, "tenant-07 out of produce order"},
		{KindOutage, nil, nil, func(r *RunResult) { r.UnfinishedAfterDrain = 3 }, "unfinished after the drain"},
		{KindOutage, nil, nil, func(r *RunResult) { r.PartitionMismatches = 2 }, "messages on the partition their key hashes to"},
		{KindLongOutage, []string{"partition-mates p99", "largest commit lag during the outage"}, []string{"healthy p99", "parked"},
			func(r *RunResult) { r.MaxLagFault = 2001 }, "largest commit lag during the outage"},
		{KindLongOutage, nil, nil, func(r *RunResult) { r.LagSamples = 0 }, "largest commit lag during the outage"},
		{KindLongOutage, nil, nil, func(r *RunResult) { r.MatesP99 = 21 * ms }, "partition-mates p99 end-to-end / baseline"},
		{KindSlow, []string{"healthy p99", "partition-mates p99", "tenant-07 parked"}, []string{"commit lag"},
			func(r *RunResult) { r.BadParked = 0 }, "tenant-07 parked (EventParked)"},
		{KindHang, []string{"tenant-07 parked"}, nil, func(r *RunResult) { r.HealthyP99 = never }, "healthy p99 end-to-end / baseline"},
		{KindHot, []string{"healthy p99", "partition-mates p99"}, []string{"parked", "commit lag"},
			func(r *RunResult) { r.MatesP99 = 20*ms + 1 }, "partition-mates p99 end-to-end / baseline"},
		{KindPoisonBurst, []string{"every poison message dead-lettered after the burst's end", "good messages dead-lettered",
			"tenant-07's p99 end-to-end after the burst", "partition-mates goodput", "lost (ringfence run)"},
			[]string{"tenant-07 dead-lettered", "DLQ's return", "parked", "commit lag"},
			func(r *RunResult) { r.BurstLastDead += 8*time.Second + 1 }, "every poison message dead-lettered after the burst's end"},
		{KindPoisonBurst, nil, nil, func(r *RunResult) { r.BurstDead-- }, "every poison message dead-lettered after the burst's end"},
		{KindPoisonBurst, nil, nil, func(r *RunResult) { r.BurstLastDead = never }, "every poison message dead-lettered after the burst's end"},
		{KindPoisonBurst, nil, nil, func(r *RunResult) { r.GoodDead = 1 }, "good messages dead-lettered"},
		{KindPoisonBurst, nil, nil, func(r *RunResult) { r.BadAfterP99 = 20*ms + 1 }, "tenant-07's p99 end-to-end after the burst / baseline"},
		{KindPoisonBurst, nil, nil, func(r *RunResult) { r.MatesGoodput = 94 }, "partition-mates goodput during the fault / baseline"},
		{KindDLQOutage, []string{"every poison message dead-lettered after the DLQ's return", "good messages dead-lettered", "lost (ringfence run)",
			"partition-mates goodput"}, []string{"p99", "tenant-07 dead-lettered"},
			func(r *RunResult) { r.BurstLastDead += 13*time.Second + 1 }, "every poison message dead-lettered after the DLQ's return"},
		{KindDLQOutage, nil, nil, func(r *RunResult) { r.Lost = 1 }, "lost (ringfence run)"},
	} {
		b := result(tc.kind)
		if f := failing(b); len(f) > 0 {
			t.Fatalf("%s: a run equal to its baseline fails %v", tc.kind, f)
		}
		names := checkNames(b)
		for _, h := range tc.has {
			if !strings.Contains(names, h) {
				t.Errorf("%s: no check %q in %s", tc.kind, h, names)
			}
		}
		for _, h := range tc.hasNot {
			if strings.Contains(names, h) {
				t.Errorf("%s: unexpected check %q in %s", tc.kind, h, names)
			}
		}
		r := b.Runs[PerTenant]
		tc.breakIt(&r)
		b.Runs[PerTenant] = r
		if f := failing(b); len(f) != 1 || f[0] != tc.fails {
			t.Errorf("%s: failing %v, want just %q", tc.kind, f, tc.fails)
		}
		if b.asExpected() || !strings.Contains(b.Verdict(), "NOT as expected") {
			t.Errorf("%s: verdict %q", tc.kind, b.Verdict())
		}
	}
}

func TestChecksEdges(t *testing.T) {
	t.Parallel()
	// Exactly at the thresholds passes.
	b := result(KindHot)
	r := b.Runs[PerTenant]
	r.HealthyGoodput, r.MatesGoodput, r.HealthyP99, r.MatesP99 = 380, 95, 20*ms, 20*ms
	b.Runs[PerTenant] = r
	if f := failing(b); len(f) > 0 {
		t.Errorf("at the thresholds: failing %v", f)
	}
	// No partition-mates: their checks are skipped, not failed.
	b = result(KindHot)
	b.Mates = nil
	skipped := 0
	for _, c := range b.Checks() {
		if c.Skipped {
			skipped++
			if !c.OK || !strings.Contains(c.Name, "partition-mates") {
				t.Errorf("skipped check %+v", c)
			}
		}
	}
	if skipped != 2 {
		t.Errorf("%d skipped checks, want 2 (mates goodput and p99)", skipped)
	}
	// A baseline that handled nothing in the window cannot pass.
	b = result(KindOutage)
	base := b.Runs[Baseline]
	base.HealthyGoodput = 0
	b.Runs[Baseline] = base
	if f := failing(b); len(f) != 1 || !strings.Contains(f[0], "healthy goodput") {
		t.Errorf("empty baseline: failing %v", f)
	}
	// A lost message in the shared run is a loss too.
	b = result(KindOutage)
	b.Runs[Shared] = RunResult{Mode: Shared, Ran: true, figures: figures{Lost: 3}}
	if f := failing(b); len(f) != 1 || f[0] != "lost (shared run)" {
		t.Errorf("shared loss: failing %v", f)
	}
	// The heap budget, when set.
	b = result(KindLongOutage)
	b.HeapBudget = 64 << 20
	r = b.Runs[PerTenant]
	r.ConsumerHeap = 65 << 20
	b.Runs[PerTenant] = r
	if f := failing(b); len(f) != 1 || f[0] != "peak consumer heap" {
		t.Errorf("heap over budget: failing %v", f)
	}
	// A poison burst dead-lettered at the bound passes; no poison produced
	// fails.
	b = result(KindDLQOutage)
	r = b.Runs[PerTenant]
	r.BurstLastDead = b.Sc.FaultEnd + DLQReturnBound
	b.Runs[PerTenant] = r
	if f := failing(b); len(f) > 0 {
		t.Errorf("the last dead letter at the bound: failing %v", f)
	}
	r.BurstPoison, r.BurstDead = 0, 0
	b.Runs[PerTenant] = r
	if f := failing(b); len(f) != 1 || !strings.Contains(f[0], "every poison message") {
		t.Errorf("no poison produced: failing %v", f)
	}
	// Not keyed (NATS): no partition check.
	b = result(KindOutage)
	b.Keyed = false
	if strings.Contains(checkNames(b), "hashes to") {
		t.Error("partition check on an unkeyed broker")
	}
}

func TestJSONReport(t *testing.T) {
	t.Parallel()
	b := result(KindHang)
	b.Tenants = []string{"tenant-01", "tenant-07"}
	r := b.Runs[PerTenant]
	r.HealthyP99 = never
	r.Tenants = []TenantResult{{Tenant: "tenant-01", Mate: true}, {Tenant: "tenant-07", Role: "hang", Trips: 2, MaxParked: 9}}
	b.Runs[PerTenant] = r
	raw, err := json.Marshal(b.JSON())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if m["scenario"] != "hang" || m["ok"] != false || m["outage_tenant_breaker_trips"] != 2.0 || m["outage_tenant_max_parked"] != 9.0 {
		t.Errorf("JSON %s", raw)
	}
	if _, ok := m["healthy_ratio_shared"]; ok {
		t.Errorf("shared figures without a shared run: %s", raw)
	}
	runs := m["runs"].(map[string]any)
	rf := runs["ringfence"].(map[string]any)
	if rf["healthy_p99_ms"] != nil || rf["healthy_p99_ratio"] != nil || rf["mates_p99_ms"] != 10.0 || rf["bad_breaker_trips"] != 2.0 {
		t.Errorf("ringfence run JSON %v", rf)
	}
	if len(m["checks"].([]any)) != len(b.Checks()) {
		t.Errorf("checks %v", m["checks"])
	}
}

func TestFormat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ got, want string }{
		{fmtLatency(never), "never"},
		{fmtLatency(1500 * time.Microsecond), "1.5ms"},
		{fmtLatency(24 * time.Second), "24.00s"},
		{fmtRatio(ratio(1, 0)), "n/a"},
		{fmtRatio(p99Ratio(RunResult{figures: figures{HealthyP99: never, HealthyN: 1}}, RunResult{figures: figures{HealthyP99: ms, HealthyN: 1}}, false)), "inf"},
		{fmtRatio(0.333), "0.33"},
		{fmtBytes(3 << 19), "1.5 MiB"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// The default long-outage lag bound is the busiest partition's messages in
// the engine's StuckAfter plus a second.
func TestLagBoundFor(t *testing.T) {
	sc := Scenario{Kind: KindLongOutage, Duration: 10 * time.Second}.withDefaults()
	p := &plan{sc: sc, owner: make([]int32, 2500)} // 250 msg/s, one partition
	if got := lagBoundFor(p, groups{}); got != 2750 {
		t.Fatalf("bound %d, want 2750 (250 msg/s x 11s)", got)
	}
	for i := range p.owner {
		p.owner[i] = int32(i % 2)
	}
	g := groups{keyed: true, part: []int{0, 1}}
	if got := lagBoundFor(p, g); got != 1375 {
		t.Fatalf("bound %d over two partitions, want 1375", got)
	}
}

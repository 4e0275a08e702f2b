package demo

import (
	"fmt"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/policy"
)

func TestValueRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []decodedValue{
		{"tenant-01", 0, kindOK, 0},
		{"tenant-13", 123456, kindPoison, 1_761_000_000_123_456_789},
		{"x", maxMessages, kindOK, 1<<63 - 1},
	} {
		v := encodeValue(tc.tenant, tc.id, tc.kind, tc.stamp)
		got, ok := decodeValue(v)
		if !ok || got != tc {
			t.Fatalf("decode(%q) = %+v, %v; want %+v", v, got, ok, tc)
		}
	}
	// A '|' in the tenant is never produced by the demo: decoding must fail
	// closed rather than misattribute the message.
	if got, ok := decodeValue(encodeValue("a|b", 7, kindOK, 1)); ok {
		t.Fatalf("decode accepted an ambiguous tenant: %+v", got)
	}
	for _, bad := range []string{
		"", "|", "t|1", "t|1|o", "t||o|1", "t|-1|o|1", "t|x|o|1", "|1|o|1", "t|1|oo|1", "t|1|x|1",
		"t|1|o|", "t|1|o|-5", "t|1|o|+5", "t|01|o|1", "t|1|o|01", "t|1|o|1|2", "t|1|o|99999999999999999999",
		fmt.Sprintf("t|%d|o|1", maxMessages+1), "0|0|\x8d",
	} {
		if got, ok := decodeValue([]byte(bad)); ok {
			t.Errorf("decode(%q) accepted: %+v", bad, got)
		}
	}
}

func FuzzDecodeValue(f *testing.F) {
	f.Add([]byte("tenant-01|12|o|1761000000123456789"))
	f.Add([]byte("x|0|p|0"))
	f.Add([]byte("|||"))
	f.Add([]byte("t|1|o|9223372036854775808"))
	f.Fuzz(func(t *testing.T, v []byte) {
		d, ok := decodeValue(v)
		if !ok {
			return
		}
		if d.id < 0 || d.id > maxMessages || d.stamp < 0 || d.tenant == "" || strings.Contains(d.tenant, "|") {
			t.Fatalf("decode(%q) = %+v", v, d)
		}
		// Whatever was accepted is exactly what encodeValue writes.
		if again := encodeValue(d.tenant, d.id, d.kind, d.stamp); string(again) != string(v) {
			t.Fatalf("decode(%q) = %+v re-encodes to %q", v, d, again)
		}
	})
}

func TestScenarioDefaults(t *testing.T) {
	t.Parallel()
	s := time.Second
	for _, tc := range []struct {
		in                          Scenario
		duration, faultStart, fault time.Duration
		poison                      int
		policy                      string
	}{
		{Scenario{}, 8 * s, 2 * s, 3200 * time.Millisecond, 20, "demo"},
		{Scenario{Duration: 60 * s}, 60 * s, 15 * s, 24 * s, 20, "demo"},
		{Scenario{Fault: 4 * s}, 10 * s, 2500 * time.Millisecond, 4 * s, 20, "demo"},
		{Scenario{Kind: KindLongOutage}, 330 * s, 10 * s, 5 * time.Minute, 0, "demo"},
		{Scenario{Kind: KindLongOutage, Fault: time.Minute}, 90 * s, 10 * s, time.Minute, 0, "demo"},
		{Scenario{Kind: KindSlow}, 45 * s, 5 * s, 30 * s, 0, "default"},
		{Scenario{Kind: KindHang, PoisonEvery: 10}, 45 * s, 5 * s, 30 * s, 10, "default"},
		{Scenario{Kind: KindHot}, 75 * s, 5 * s, 60 * s, 0, "default"},
		// A short run (tests): the fault in the middle third of what is left.
		{Scenario{Kind: KindHot, Duration: 5 * s, Fault: 2 * s}, 5 * s, s, 2 * s, 0, "default"},
		{Scenario{Kind: KindSlow, FaultStart: s, FaultEnd: 3 * s, Duration: 4 * s}, 4 * s, s, 2 * s, 0, "default"},
	} {
		sc := tc.in.withDefaults()
		if err := sc.validate(); err != nil {
			t.Errorf("%+v: %v", tc.in, err)
			continue
		}
		if sc.Duration != tc.duration || sc.FaultStart != tc.faultStart || sc.Fault != tc.fault || sc.FaultEnd != tc.faultStart+tc.fault ||
			sc.PoisonEvery != tc.poison || sc.PolicyName != tc.policy {
			t.Errorf("%s %+v: duration %v, window [%v, %v) (fault %v), poison every %d, policy %s", sc.Kind, tc.in,
				sc.Duration, sc.FaultStart, sc.FaultEnd, sc.Fault, sc.PoisonEvery, sc.PolicyName)
		}
	}
	sc := Scenario{Kind: KindHang}.withDefaults()
	if sc.Policy.Deadline != 0 {
		t.Errorf("hang runs with the consumer's default policy (no deadline today), got deadline %v", sc.Policy.Deadline)
	}
	if sc := (Scenario{Kind: KindOutage}).withDefaults(); sc.Policy.Deadline != time.Second {
		t.Errorf("outage runs with DemoPolicy, got %+v", sc.Policy)
	}
	// The drain waits out the breaker's longest open period after a probe
	// that ran its attempt's whole timeout, before it calls a run stalled.
	for _, tc := range []struct {
		in    Scenario
		stall time.Duration
	}{
		{Scenario{Kind: KindHang}, 75 * s},           // policy.Default(): open up to 1m, attempts 10s
		{Scenario{Kind: KindOutage}, 15 * s},         // DemoPolicy: open up to 2s, deadline 1s
		{Scenario{Kind: KindHang, Stall: s}, s},      // set: kept
		{Scenario{Policy: &policy.Policy{}}, 15 * s}, // no breaker
		{Scenario{Policy: &policy.Policy{Breaker: &policy.Breaker{OpenTimeout: 2 * time.Minute}, Deadline: 3 * s}}, 128 * s},
	} {
		if got := tc.in.withDefaults().Stall; got != tc.stall {
			t.Errorf("%s %+v: stall %v, want %v", tc.in.Kind, tc.in, got, tc.stall)
		}
	}
	// The drain has room for the hot tenant's fault traffic, handled one
	// at a time in order.
	for _, tc := range []struct {
		in    Scenario
		drain time.Duration
	}{
		{Scenario{Kind: KindHot}, 6 * time.Minute},                          // 25/s x 4 x 20 x 60s = 120,000 x 3ms
		{Scenario{Kind: KindHot, Fault: 5 * time.Minute}, 30 * time.Minute}, // 600,000 x 3ms
		{Scenario{Kind: KindHot, Fault: 10 * s}, 5 * time.Minute},           // the floor
		{Scenario{Kind: KindHot, Fault: 5 * time.Minute, Drain: time.Minute}, time.Minute},
		{Scenario{Kind: KindHang, Fault: 5 * time.Minute}, 5 * time.Minute},
	} {
		if got := tc.in.withDefaults().Drain; got != tc.drain {
			t.Errorf("%s %+v: drain %v, want %v", tc.in.Kind, tc.in, got, tc.drain)
		}
	}
}

func TestScenarioValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sc   Scenario
	}{
		{"unknown kind", Scenario{Kind: "flood"}},
		{"too few tenants", Scenario{Tenants: 2}},
		{"zero rate", Scenario{Rate: -1}},
		{"short duration", Scenario{Duration: time.Millisecond}},
		{"window outside", Scenario{Duration: 2 * time.Second, FaultStart: time.Second, FaultEnd: 3 * time.Second}},
		{"fault longer than the run", Scenario{Kind: KindSlow, Duration: 10 * time.Second, Fault: 20 * time.Second}},
		{"poison every 1", Scenario{PoisonEvery: 1}},
		{"hot factor", Scenario{Kind: KindHot, HotFactor: -2}},
		{"slow latency", Scenario{Kind: KindSlow, SlowLatency: -time.Second}},
		{"too many partitions", Scenario{Partitions: 5000}},
		{"too long", Scenario{Kind: KindLongOutage, Fault: 3 * time.Hour}},
		{"too many messages", Scenario{Kind: KindHot, Rate: 1000, Tenants: 10000, Fault: time.Hour}},
		{"negative drain", Scenario{Drain: -time.Second}},
	} {
		if err := tc.sc.withDefaults().validate(); err == nil {
			t.Errorf("%s: validate accepted %+v", tc.name, tc.sc)
		}
	}
	for _, k := range Kinds {
		if err := (Scenario{Kind: k}).withDefaults().validate(); err != nil {
			t.Errorf("%s defaults invalid: %v", k, err)
		}
	}
	if _, err := ParseKind("HOT"); err != nil {
		t.Error(err)
	}
	if _, err := ParseKind("storm"); err == nil || !strings.Contains(err.Error(), "long-outage") {
		t.Errorf("ParseKind(storm) = %v", err)
	}
}

func TestPlan(t *testing.T) {
	t.Parallel()
	sc := Scenario{Tenants: 20, Rate: 25, Duration: 8 * time.Second}.withDefaults()
	p := newPlan(sc, true)
	if p.tenants[p.bad] != "tenant-07" || p.poison < 0 || p.tenants[p.poison] != "tenant-13" {
		t.Fatalf("bad %s, poison %d", p.tenants[p.bad], p.poison)
	}
	perT := make([]int, sc.Tenants)
	lastKind := make([]byte, sc.Tenants)
	for id := range p.total {
		if id > 0 && p.due[id] < p.due[id-1] {
			t.Fatalf("id %d due %v before id %d at %v", id, p.due[id], id-1, p.due[id-1])
		}
		tn := int(p.owner[id])
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
	if perT[0] != 200 || perT[p.bad] != 800 {
		t.Fatalf("per-tenant counts %v (want 200 each, 800 for the bad tenant)", perT)
	}
	if got := p.poisonCount(); got != 10 {
		t.Fatalf("poison count %d, want 10", got)
	}
	if due := p.due[p.total-1]; due >= sc.Duration {
		t.Fatalf("last message due at %v, past the duration", due)
	}
	for _, k := range []Kind{KindLongOutage, KindSlow, KindHang, KindHot} {
		p := newPlan(Scenario{Kind: k, Duration: 10 * time.Second, Fault: 4 * time.Second}.withDefaults(), true)
		if p.poison != -1 || p.poisonCount() != 0 {
			t.Errorf("%s: poison tenant %d with %d poison messages; the fault scenarios have none", k, p.poison, p.poisonCount())
		}
		if !p.healthy(p.bad+1) || p.healthy(p.bad) {
			t.Errorf("%s: healthy() wrong", k)
		}
	}
}

// TestPlanHot: the hot tenant's burst is in the faulty plan only, within
// the window, at HotFactor times its rate; everyone else's traffic is the
// same in both plans.
func TestPlanHot(t *testing.T) {
	t.Parallel()
	sc := Scenario{Kind: KindHot, Tenants: 5, Rate: 10, Duration: 9 * time.Second, Fault: 3 * time.Second}.withDefaults()
	base, hot := newPlan(sc, false), newPlan(sc, true)
	count := func(p *plan) (perT []int, badIn int) {
		perT = make([]int, sc.Tenants)
		for id := range p.total {
			perT[p.owner[id]]++
			if int(p.owner[id]) == p.bad && p.due[id] >= sc.FaultStart && p.due[id] < sc.FaultEnd {
				badIn++
			}
		}
		return perT, badIn
	}
	bt, bIn := count(base)
	ht, hIn := count(hot)
	// 10/s x weight 4 = 40/s; 3s of window; x20 in the burst.
	if bIn != 120 || hIn != 2400 {
		t.Fatalf("bad tenant in the window: baseline %d (want 120), hot %d (want 2400)", bIn, hIn)
	}
	if bt[base.bad] != 360 || ht[hot.bad] != 360-120+2400 {
		t.Fatalf("bad tenant totals: baseline %d, hot %d", bt[base.bad], ht[hot.bad])
	}
	for i := range bt {
		if i != base.bad && bt[i] != ht[i] {
			t.Fatalf("tenant %d: %d messages in the baseline, %d in the hot plan", i, bt[i], ht[i])
		}
	}
	for id := 1; id < hot.total; id++ {
		if hot.due[id] < hot.due[id-1] {
			t.Fatalf("hot plan not in due order at %d", id)
		}
	}
}

// TestPlanBurst: a poison burst is in the faulty plan only: every message
// the bad tenant sends in the window is poison, and nothing else changes.
func TestPlanBurst(t *testing.T) {
	t.Parallel()
	for _, k := range []Kind{KindPoisonBurst, KindDLQOutage} {
		sc := Scenario{Kind: k, Tenants: 5, Rate: 10, Duration: 9 * time.Second, Fault: 3 * time.Second}.withDefaults()
		base, burst := newPlan(sc, false), newPlan(sc, true)
		if base.total != burst.total || base.poison != -1 || base.burstCount() != 0 || burst.poisonCount() != 0 {
			t.Fatalf("%s: totals %d/%d, poison tenant %d, base burst %d, poison %d", k, base.total, burst.total, base.poison, base.burstCount(), burst.poisonCount())
		}
		for id := range burst.total {
			in := int(burst.owner[id]) == burst.bad && burst.due[id] >= sc.FaultStart && burst.due[id] < sc.FaultEnd
			if (burst.kinds[id] == kindPoison) != in || base.kinds[id] != kindOK || base.due[id] != burst.due[id] {
				t.Fatalf("%s: message %d (tenant %d at %v) is %c in the burst plan, %c in the baseline", k, id, burst.owner[id], burst.due[id], burst.kinds[id], base.kinds[id])
			}
		}
		// 10/s x weight 4 = 40/s for 3s.
		if n := burst.burstCount(); n != 120 {
			t.Errorf("%s: %d poison messages, want 120", k, n)
		}
	}
}

// TestHashPartition: the demo's idea of a tenant's partition is the one the
// Kafka producer (kafka-go's Hash balancer) uses.
func TestHashPartition(t *testing.T) {
	t.Parallel()
	var h kafkago.Hash
	for _, n := range []int{1, 2, 3, 4, 7, 16} {
		parts := make([]int, n)
		for i := range parts {
			parts[i] = i
		}
		for i := range 500 {
			key := fmt.Sprintf("tenant-%02d", i)
			if i%7 == 0 {
				key = fmt.Sprintf("k\xff%d\x00", i*7919) // not UTF-8
			}
			if got, want := hashPartition(key, n), h.Balance(kafkago.Message{Key: []byte(key)}, parts...); got != want {
				t.Fatalf("hashPartition(%q, %d) = %d, kafka-go Hash says %d", key, n, got, want)
			}
		}
	}
}

func TestGroups(t *testing.T) {
	t.Parallel()
	p := newPlan(Scenario{Tenants: 20}.withDefaults(), true)
	g := newGroups(p, func(tn string) (int, bool) { return hashPartition(tn, 4), true })
	if !g.keyed || g.badPart != 1 {
		t.Fatalf("keyed %v, bad partition %d", g.keyed, g.badPart)
	}
	want := "tenant-01, tenant-03, tenant-09, tenant-12, tenant-16, tenant-18"
	if got := strings.Join(g.mateNames(p), ", "); got != want {
		t.Fatalf("partition-mates %s, want %s", got, want)
	}
	for i, m := range g.mates {
		if m && (!p.healthy(i) || g.part[i] != g.badPart) {
			t.Fatalf("mate %s is unhealthy or elsewhere", p.tenants[i])
		}
	}
	// No partitions (NATS): every healthy tenant shares the one consumer.
	g = newGroups(p, func(string) (int, bool) { return 0, false })
	if g.keyed || g.badPart != -1 || len(g.mateNames(p)) != 18 {
		t.Fatalf("unkeyed groups: keyed %v, bad partition %d, %d mates (want 18: all but the bad and poison tenants)", g.keyed, g.badPart, len(g.mateNames(p)))
	}
}

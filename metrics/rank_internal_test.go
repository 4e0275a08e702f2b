package metrics

import (
	"slices"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/policy"
)

// The tenants most worth watching are named: an open, then half-open
// breaker, then most parked, spilling, the oldest time lag, most queued,
// then by key.
func TestTopTenantsRank(t *testing.T) {
	t.Parallel()
	ts := []consumer.TenantStats{
		{Tenant: "a-idle"},
		{Tenant: "b-queued", Queued: 5},
		{Tenant: "c-lag", TimeLag: time.Minute},
		{Tenant: "d-spilling", Spilling: 1},
		{Tenant: "e-parked", Parked: 1},
		{Tenant: "f-half", State: policy.HalfOpen},
		{Tenant: "g-open", State: policy.Open},
	}
	for k, want := range map[int][]string{
		1: {"g-open"},
		2: {"f-half", "g-open"},
		3: {"e-parked", "f-half", "g-open"},
		4: {"d-spilling", "e-parked", "f-half", "g-open"},
		5: {"c-lag", "d-spilling", "e-parked", "f-half", "g-open"},
		6: {"b-queued", "c-lag", "d-spilling", "e-parked", "f-half", "g-open"},
		7: {"a-idle", "b-queued", "c-lag", "d-spilling", "e-parked", "f-half", "g-open"},
	} {
		named, rest := topTenants(slices.Clone(ts), k)
		var got []string
		for _, x := range named {
			got = append(got, x.Tenant)
		}
		if !slices.Equal(got, want) || len(rest) != len(ts)-k {
			t.Errorf("k=%d: named %v (rest %d), want %v", k, got, len(rest), want)
		}
	}
}

// _other holds the totals minus the named tenants' counters and dwell, the
// rest's gauges of counts summed, their ages and breaker state maxed.
func TestOtherSumsAndMaxes(t *testing.T) {
	t.Parallel()
	h := func(counts ...uint64) consumer.Histogram {
		return consumer.Histogram{Counts: counts, Count: counts[len(counts)-1], Sum: time.Duration(counts[len(counts)-1]) * time.Second}
	}
	st := consumer.Stats{Totals: consumer.Totals{Handled: 100, Failed: 10, DeadLettered: 4, Spilled: 7, Refed: 6, Dwell: h(50, 80, 104)}}
	named := []consumer.TenantStats{{Handled: 30, Failed: 10, DeadLettered: 1, Spilled: 7, Refed: 6, Dwell: h(10, 20, 31)}}
	rest := []consumer.TenantStats{
		{Parked: 2, Queued: 3, State: policy.HalfOpen, TimeLag: time.Second, OldestParked: 3 * time.Second, SpillBacklogAge: time.Minute},
		{Parked: 1, Queued: 4, State: policy.Closed, TimeLag: 2 * time.Second, OldestParked: time.Second},
	}
	o := other(&st, named, rest)
	want := consumer.TenantStats{
		Handled: 70, DeadLettered: 3, Parked: 3, Queued: 7, State: policy.HalfOpen,
		TimeLag: 2 * time.Second, OldestParked: 3 * time.Second, SpillBacklogAge: time.Minute,
		Dwell: consumer.Histogram{Counts: []uint64{40, 60, 73}, Count: 73, Sum: 73 * time.Second},
	}
	if o.Handled != want.Handled || o.Failed != 0 || o.DeadLettered != want.DeadLettered || o.Spilled != 0 || o.Refed != 0 ||
		o.Parked != want.Parked || o.Queued != want.Queued || o.State != want.State ||
		o.TimeLag != want.TimeLag || o.OldestParked != want.OldestParked || o.SpillBacklogAge != want.SpillBacklogAge ||
		!slices.Equal(o.Dwell.Counts, want.Dwell.Counts) || o.Dwell.Count != want.Dwell.Count || o.Dwell.Sum != want.Dwell.Sum {
		t.Fatalf("other = %+v\nwant    %+v", *o, want)
	}
	if st.Dwell.Counts[0] != 50 {
		t.Fatal("other changed the totals' histogram")
	}
}

package fleet

import (
	"cmp"
	"slices"
	"strings"
)

// View is the fleet as the CLI and the console show it: the live
// processes, who owns which partition, each tenant not healthy across
// processes, and the active controls.
type View struct {
	Processes  []Status          // sorted by Process
	Partitions []PartitionOwners // sorted by partition
	Tenants    []TenantView      // worst first
	Controls   []ControlRecord   // active ones, sorted by tenant
}

// PartitionOwners lists the processes that report a partition (more than
// one while a rebalance moves it).
type PartitionOwners struct {
	Partition string
	Owners    []string
}

// TenantView is one tenant not healthy somewhere: what each process
// reports of it, and its control.
type TenantView struct {
	Tenant  string
	On      []ProcessTenant // sorted by Process
	Control *ControlRecord  // nil without an active control
}

// ProcessTenant is what one process reports of a tenant.
type ProcessTenant struct {
	Process string
	TenantStatus
}

// NewView builds the view from live statuses and the control table.
func NewView(statuses map[string]Status, controls map[string]ControlRecord) View {
	var v View
	owners := map[string][]string{}
	tenants := map[string]*TenantView{}
	for _, s := range statuses {
		v.Processes = append(v.Processes, s)
		for _, p := range s.Partitions {
			owners[p] = append(owners[p], s.Process)
		}
		for _, t := range s.Tenants {
			tv := tenants[t.Tenant]
			if tv == nil {
				tv = &TenantView{Tenant: t.Tenant}
				tenants[t.Tenant] = tv
			}
			tv.On = append(tv.On, ProcessTenant{Process: s.Process, TenantStatus: t})
		}
	}
	slices.SortFunc(v.Processes, func(a, b Status) int { return strings.Compare(a.Process, b.Process) })
	for p, o := range owners {
		slices.Sort(o)
		v.Partitions = append(v.Partitions, PartitionOwners{Partition: p, Owners: o})
	}
	slices.SortFunc(v.Partitions, func(a, b PartitionOwners) int { return comparePartition(a.Partition, b.Partition) })
	for t, r := range controls {
		if !r.Active() {
			continue
		}
		v.Controls = append(v.Controls, r)
		if tv := tenants[t]; tv != nil {
			tv.Control = &r
		}
	}
	slices.SortFunc(v.Controls, func(a, b ControlRecord) int { return strings.Compare(a.Tenant, b.Tenant) })
	for _, tv := range tenants {
		slices.SortFunc(tv.On, func(a, b ProcessTenant) int { return strings.Compare(a.Process, b.Process) })
		v.Tenants = append(v.Tenants, *tv)
	}
	worst := func(tv TenantView) int {
		w := 0
		for _, o := range tv.On {
			w = max(w, severity(o.TenantStatus))
		}
		return w
	}
	slices.SortFunc(v.Tenants, func(a, b TenantView) int {
		return cmp.Or(cmp.Compare(worst(b), worst(a)), strings.Compare(a.Tenant, b.Tenant))
	})
	return v
}

// comparePartition orders "topic/id" by topic, then by id as a number.
func comparePartition(a, b string) int {
	ai, bi := strings.LastIndexByte(a, '/'), strings.LastIndexByte(b, '/')
	if ai < 0 || bi < 0 || a[:ai] != b[:bi] {
		return strings.Compare(a, b)
	}
	return cmp.Or(cmp.Compare(len(a), len(b)), strings.Compare(a, b))
}

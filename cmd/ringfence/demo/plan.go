package demo

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// plan is the traffic of a run. Message ids are in the order they are due,
// so within one tenant (one Kafka key, one partition) the id order is the
// produce order.
type plan struct {
	sc Scenario
	// faulty: the run has the fault (for hot, the burst is in the plan;
	// for poison-burst and dlq-outage, the bad tenant's poison messages).
	faulty  bool
	tenants []string
	bad     int // tenant index of the bad tenant
	poison  int // tenant index of the poison tenant; -1 when there is none
	total   int
	owner   []int32         // tenant index, by id
	due     []time.Duration // from the start of the run, by id
	kinds   []byte          // by id
}

// segment is a stretch of a tenant's traffic at one rate.
type segment struct {
	from, to time.Duration
	rate     float64 // messages per second
}

func newPlan(sc Scenario, faulty bool) *plan {
	p := &plan{sc: sc, faulty: faulty, poison: -1}
	for i := range sc.Tenants {
		p.tenants = append(p.tenants, fmt.Sprintf("tenant-%02d", i+1))
	}
	p.bad = (sc.Tenants - 1) / 3
	if sc.PoisonEvery > 0 {
		p.poison = 2 * (sc.Tenants - 1) / 3
		if p.poison == p.bad {
			p.poison = p.bad + 1
		}
	}
	type msg struct {
		t, k int
		at   time.Duration
	}
	var all []msg
	for t := range sc.Tenants {
		// Tenants are staggered evenly within each period of a segment.
		stagger := float64(t) / float64(sc.Tenants)
		k := 0
		for _, s := range p.segments(t) {
			for i := 0; ; i++ {
				at := s.from + time.Duration((float64(i)+stagger)/s.rate*float64(time.Second))
				if at >= s.to {
					break
				}
				all = append(all, msg{t: t, k: k, at: at})
				k++
			}
		}
	}
	slices.SortStableFunc(all, func(a, b msg) int { return cmp.Compare(a.at, b.at) })
	p.total = len(all)
	perT := make([]int, sc.Tenants)
	for _, m := range all {
		perT[m.t]++
	}
	p.owner = make([]int32, 0, p.total)
	p.due = make([]time.Duration, 0, p.total)
	p.kinds = make([]byte, 0, p.total)
	for _, m := range all {
		kind := byte(kindOK)
		// Never two poison messages in a row, never the tenant's last one:
		// a good message follows each and shows that it alone is at fault.
		if m.t == p.poison && m.k%sc.PoisonEvery == sc.PoisonEvery/2 && m.k < perT[m.t]-1 {
			kind = kindPoison
		}
		if p.burst(m.t, m.at) {
			kind = kindPoison
		}
		p.owner = append(p.owner, int32(m.t))
		p.due = append(p.due, m.at)
		p.kinds = append(p.kinds, kind)
	}
	return p
}

// segments is tenant t's traffic: one rate for the run, but the bad tenant
// of a hot run sends HotFactor times its rate during the fault.
func (p *plan) segments(t int) []segment {
	sc := p.sc
	rate := float64(sc.Rate)
	if t == p.bad {
		rate *= float64(sc.BadWeight)
		if sc.Kind == KindHot && p.faulty {
			return []segment{
				{0, sc.FaultStart, rate},
				{sc.FaultStart, sc.FaultEnd, rate * float64(sc.HotFactor)},
				{sc.FaultEnd, sc.Duration, rate},
			}
		}
	}
	return []segment{{0, sc.Duration, rate}}
}

// burst reports whether tenant t's message due at is one of the bad
// tenant's poison burst: every message it sends during the fault of a
// faulty poison-burst or dlq-outage run.
func (p *plan) burst(t int, at time.Duration) bool {
	return p.faulty && p.sc.Kind.poisons() && t == p.bad && at >= p.sc.FaultStart && at < p.sc.FaultEnd
}

// poisonCount counts the poison tenant's poison messages (PoisonEvery),
// not the bad tenant's burst (see burstCount).
func (p *plan) poisonCount() int {
	n := 0
	for id, k := range p.kinds {
		if k == kindPoison && int(p.owner[id]) != p.bad {
			n++
		}
	}
	return n
}

// burstCount counts the bad tenant's poison messages.
func (p *plan) burstCount() int {
	n := 0
	for id, k := range p.kinds {
		if k == kindPoison && int(p.owner[id]) == p.bad {
			n++
		}
	}
	return n
}

func (p *plan) healthy(t int) bool { return t != p.bad && t != p.poison }

func (p *plan) role(t int) string {
	switch t {
	case p.bad:
		return p.sc.Kind.Role()
	case p.poison:
		return "poison"
	}
	return ""
}

// groups says which tenants share the bad tenant's partition, as the
// broker's producer places them.
type groups struct {
	// keyed is false when the broker has no partitions to key onto (NATS:
	// one stream, one consumer): then every healthy tenant is a
	// partition-mate.
	keyed bool
	// part is each tenant's partition (-1 when not keyed).
	part []int
	// badPart is the bad tenant's partition (-1 when not keyed).
	badPart int
	// mates marks, by tenant, the healthy tenants sharing the bad tenant's
	// partition.
	mates []bool
}

// newGroups places the plan's tenants with partitionOf, the broker's own
// key-to-partition function.
func newGroups(p *plan, partitionOf func(tenant string) (int, bool)) groups {
	g := groups{keyed: true, part: make([]int, len(p.tenants)), mates: make([]bool, len(p.tenants)), badPart: -1}
	for i, name := range p.tenants {
		part, keyed := partitionOf(name)
		if !keyed {
			g.keyed = false
			part = -1
		}
		g.part[i] = part
	}
	if g.keyed {
		g.badPart = g.part[p.bad]
	}
	for i := range p.tenants {
		g.mates[i] = p.healthy(i) && (!g.keyed || g.part[i] == g.badPart)
	}
	return g
}

// mateNames lists the partition-mates.
func (g groups) mateNames(p *plan) []string {
	var out []string
	for i, m := range g.mates {
		if m {
			out = append(out, p.tenants[i])
		}
	}
	return out
}

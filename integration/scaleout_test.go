package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	natsad "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/internal/brokertest"
)

// Sizes and timeline of the scale-out scenario. Every tenant produces one
// message a round; the run is bounded by scaleMaxRounds whatever happens.
const (
	scaleTenants      = 24
	scalePartitions   = 12 // of the Kafka topic
	scaleRoundEvery   = 100 * time.Millisecond
	scaleMaxRounds    = 2400
	scaleWindow       = 20 * time.Second // each goodput window: before the failure, and its start
	scaleFaultFor     = 60 * time.Second // the failing tenant's outage
	scaleAfterFault   = 5 * time.Second  // traffic after the outage, before the producer stops
	scaleStepTimeout  = 45 * time.Second // one step: a process joining, the broker back
	scaleParkedBound  = 20               // the consumers' MaxParkedPerTenant
	scaleGoodputFloor = 0.95
)

// scaleOutRuns are the runs of the scale-out scenario: a broker and the
// source its consumers run (see sourceKinds). The run on kafka-go's eager
// Source (kafka "group") is opt-in with RINGFENCE_SCALEOUT_ALL=1: the
// integration package runs under go test's default 10-minute timeout, and
// TestRebalanceCost in adapters/kafka already compares the two sources.
var scaleOutRuns = []struct {
	broker, source string
	optIn          bool
}{
	{"kafka", "kgo", false},
	{"kafka", "group", true},
	{"nats", "pcgroup", false},
}

// TestScaleOut runs three consumer processes in one group over tenant-keyed
// traffic of scaleTenants tenants while one tenant's dependency is down for
// scaleFaultFor (it parks and spills); during the outage each process is
// killed with SIGKILL and restarted in turn, then the broker container is
// restarted; then everything drains. Nothing is lost or dead-lettered;
// every inversion of a tenant's order among first handlings is explained by
// a redelivery or an EventReordered; the failing tenant's partition-mates
// (Kafka; every other tenant on NATS) keep their goodput during the outage.
func TestScaleOut(t *testing.T) {
	for _, run := range scaleOutRuns {
		t.Run(run.broker+"-"+run.source, func(t *testing.T) {
			if run.optIn && os.Getenv("RINGFENCE_SCALEOUT_ALL") == "" {
				t.Skip("set RINGFENCE_SCALEOUT_ALL=1 to run it")
			}
			scaleOut(t, run.broker, run.source)
		})
	}
}

func scaleOut(t *testing.T, kind, source string) {
	phase := phaseLog(t)
	r := newRigPartitions(t, kind, false, scalePartitions)
	tenants := tenantNames(scaleTenants)
	failing := crowdedTenant(kind, tenants, scalePartitions)
	fault := filepath.Join(r.dir, "failing-dependency-down")
	events := filepath.Join(r.dir, "events.log")
	mod := func(c *childConfig) {
		c.Source = source
		c.WorkMs = 2
		c.FaultTenant, c.FaultFile = failing, fault
		c.MaxParkedPerTenant = scaleParkedBound
		c.Events, c.TraceDeliveries = events, true
		c.Member = strings.TrimSuffix(c.Name, "b") // c1b takes c1's place
	}
	names := []string{"c1", "c2", "c3"}
	if source == "pcgroup" {
		r.natsConsumerGroup(scalePartitions, names...)
	}

	stopProducing := make(chan struct{})
	prod := r.produceUntil(tenants, scaleMaxRounds, scaleRoundEvery, stopProducing)
	stopped := false
	defer func() {
		if !stopped {
			close(stopProducing)
		}
	}()
	procs := make([]*proc, len(names))
	for i, n := range names {
		procs[i] = r.startConsumer(n, mod)
	}
	r.waitFor("every consumer handling messages", scaleStepTimeout, func(hs []handledLine) bool {
		n := map[string]int{}
		for _, h := range hs {
			n[h.proc]++
		}
		return n["c1"] > 0 && n["c2"] > 0 && n["c3"] > 0
	})
	// The window before the outage opens once the backlog of the start is
	// handled, so that it does not count catching up as goodput.
	r.waitCaughtUp(time.Second, scaleStepTimeout)
	steady := time.Now()
	phase(fmt.Sprintf("3 consumers handling and caught up (source %s); failing tenant %s", source, failing))

	time.Sleep(scaleWindow) // the goodput window before the outage
	faultAt := time.Now()
	if err := os.WriteFile(fault, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	phase(failing + "'s dependency down")
	time.Sleep(scaleWindow) // the goodput window at the outage's start, before any kill

	killed := map[string]time.Time{}
	for i, n := range names {
		procs[i].kill(t)
		killed[n] = time.Now()
		next := n + "b"
		procs[i] = r.startConsumer(next, mod)
		r.waitFor(next+" handling messages", scaleStepTimeout, func(hs []handledLine) bool {
			c := 0
			for _, h := range hs {
				if h.proc == next {
					c++
				}
			}
			return c >= 20
		})
		phase(fmt.Sprintf("%s killed, %s handling", n, next))
	}
	restartFrom := time.Now()
	r.src.Restart(t)
	restartTo := time.Now()
	restartHandled := r.handledCount()
	r.waitFor("handling after the broker restart", scaleStepTimeout, func(hs []handledLine) bool {
		c := 0
		for _, h := range hs {
			if h.at.After(restartTo) {
				c++
			}
		}
		return c >= 100
	})
	phase(fmt.Sprintf("broker restarted (%d ids handled before)", restartHandled))

	time.Sleep(time.Until(faultAt.Add(scaleFaultFor)))
	if err := os.Remove(fault); err != nil {
		t.Fatal(err)
	}
	phase(failing + "'s dependency back")
	time.Sleep(scaleAfterFault)
	close(stopProducing)
	stopped = true
	awaitProducer(t, prod)
	phase(fmt.Sprintf("producer stopped with %d produced", r.producedCount()))
	r.waitSettled()
	phase("settled")
	for _, p := range procs {
		p.stop(t)
	}
	phase("drained")

	res := r.reconcile("scale-out")
	if res.deadlettered != 0 {
		t.Errorf("%d messages dead-lettered; the only fault was a transient outage", res.deadlettered)
	}
	hs := r.handled()
	evs := readEvents(t, events)
	spilled := 0
	for _, e := range evs {
		if e.kind == "spilling" && e.tenant == failing {
			spilled++
		}
	}
	if spilled == 0 {
		t.Errorf("%s never spilled during its outage", failing)
	}

	ex := explanations(evs, killed, []time.Time{restartFrom})
	report := func(line string) {
		fmt.Println(line)
		t.Log(line)
		appendReconcileOut(t, line)
	}
	scopes := []string{"tenant"}
	if kind == "kafka" {
		scopes = append(scopes, "partition")
	}
	for _, scope := range scopes {
		inv := countInversions(hs, scope, ex)
		report(fmt.Sprintf("inversions: scenario=scale-out broker=%s source=%s scope=%s firsts=%d inversions=%d redelivered=%d reordered=%d unexplained=%d",
			kind, source, scope, inv.firsts, inv.total(), inv.redelivered, inv.reordered, len(inv.unexplained)))
		if len(inv.unexplained) > 0 {
			t.Errorf("%d order inversions (scope %s) explained by no redelivery nor EventReordered, e.g. %v",
				len(inv.unexplained), scope, inv.unexplained[:min(5, len(inv.unexplained))])
		}
	}

	mates := partitionMates(kind, hs, failing, tenants)
	if len(mates) == 0 {
		t.Fatalf("%s shares its partition with no other tenant", failing)
	}
	r.mu.Lock()
	produced := make([]msg, 0, len(r.produced))
	for _, m := range r.produced {
		produced = append(produced, m)
	}
	r.mu.Unlock()
	before := goodputIn(hs, produced, mates, steady, faultAt)
	during := goodputIn(hs, produced, mates, faultAt, faultAt.Add(scaleWindow))
	ratio := during.normalized() / before.normalized()
	report(fmt.Sprintf("goodput: scenario=scale-out broker=%s source=%s mates=%d before=%.1f/s during=%.1f/s (produced %.1f/s, %.1f/s) ratio=%.3f",
		kind, source, len(mates), before.handledRate(), during.handledRate(), before.producedRate(), during.producedRate(), ratio))
	if ratio < scaleGoodputFloor {
		t.Errorf("%s's partition-mates kept %.3f of their goodput during its outage, want >= %.2f", failing, ratio, scaleGoodputFloor)
	}

	pauses := sameOwnerGaps(hs, failing, steady, restartFrom, restartTo)
	kept, keptMax := revokedAndKept(evs, steady, restartFrom, restartTo)
	report(fmt.Sprintf("pauses: scenario=scale-out broker=%s source=%s %s revoked-and-reassigned-to-its-owner=%d (longest %.2fs)",
		kind, source, pauses, kept, keptMax.Seconds()))
	phase("done")
}

// natsConsumerGroup partitions the rig's stream by tenant (the subject's
// last token) into n partitions and creates the static consumer group
// r.group of members over it.
func (r *rig) natsConsumerGroup(n int, members ...string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := natsad.PartitionTransform("orders.*", n, 1)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.js.UpdateStream(ctx, jetstream.StreamConfig{Name: r.topic, Subjects: []string{"orders.>"},
		Storage: jetstream.FileStorage, SubjectTransform: &tr}); err != nil {
		r.t.Fatalf("partition stream %s: %v", r.topic, err)
	}
	if err := natsad.CreateConsumerGroup(ctx, r.js, r.topic, r.group, members...); err != nil {
		r.t.Fatal(err)
	}
}

// waitCaughtUp polls (bounded) until every message the broker acknowledged
// lag ago or earlier is handled.
func (r *rig) waitCaughtUp(lag, timeout time.Duration) {
	r.t.Helper()
	err := brokertest.PollUntil(context.Background(), timeout, 100*time.Millisecond, func(context.Context) error {
		handled := map[string]bool{}
		for _, h := range r.handled() {
			handled[h.id] = true
		}
		until := time.Now().Add(-lag)
		r.mu.Lock()
		defer r.mu.Unlock()
		behind := 0
		for id, m := range r.produced {
			if m.at.Before(until) && !handled[id] {
				behind++
			}
		}
		if behind > 0 {
			return fmt.Errorf("%d messages acknowledged over %v ago not handled", behind, lag)
		}
		return nil
	})
	if err != nil {
		r.t.Fatalf("waiting for the consumers to catch up: %v", err)
	}
}

// crowdedTenant picks a tenant with partition-mates: on Kafka the first of
// a partition (of partitions) holding the most tenants under the
// producer's hash balancer; on NATS the first.
func crowdedTenant(kind string, tenants []string, partitions int) string {
	if kind != "kafka" {
		return tenants[0]
	}
	parts := make([]int, partitions)
	for i := range parts {
		parts[i] = i
	}
	byPart := map[int][]string{}
	for _, tn := range tenants {
		p := (&kafka.Hash{}).Balance(kafka.Message{Key: []byte(tn)}, parts...)
		byPart[p] = append(byPart[p], tn)
	}
	best := -1
	for _, p := range parts {
		if best < 0 || len(byPart[p]) > len(byPart[best]) {
			best = p
		}
	}
	return byPart[best][0]
}

// partitionMates returns the tenants that share the failing tenant's source
// partition, read from where their messages were handled; on NATS every
// other tenant.
func partitionMates(kind string, hs []handledLine, failing string, tenants []string) map[string]bool {
	out := map[string]bool{}
	if kind != "kafka" {
		for _, tn := range tenants {
			if tn != failing {
				out[tn] = true
			}
		}
		return out
	}
	part := map[string]int32{}
	for _, h := range hs {
		if _, ok := part[h.tenant]; !ok {
			part[h.tenant] = h.partition
		}
	}
	fp, ok := part[failing]
	if !ok {
		return out
	}
	for tn, p := range part {
		if tn != failing && p == fp {
			out[tn] = true
		}
	}
	return out
}

// goodput is what some tenants had handled (first handlings) and produced
// (acknowledged by the broker) in a window.
type goodput struct {
	handled, produced int
	window            time.Duration
}

func (g goodput) handledRate() float64  { return float64(g.handled) / g.window.Seconds() }
func (g goodput) producedRate() float64 { return float64(g.produced) / g.window.Seconds() }

// normalized is the handled rate over the produced rate, so that a
// producer slowed by the machine's load weighs on neither window.
func (g goodput) normalized() float64 {
	if g.produced == 0 {
		return 0
	}
	return float64(g.handled) / float64(g.produced)
}

func goodputIn(hs []handledLine, produced []msg, tenants map[string]bool, from, to time.Time) goodput {
	g := goodput{window: to.Sub(from)}
	seen := map[string]bool{}
	for _, h := range hs {
		if seen[h.id] {
			continue
		}
		seen[h.id] = true
		if tenants[h.tenant] && !h.at.Before(from) && h.at.Before(to) {
			g.handled++
		}
	}
	for _, m := range produced {
		if tenants[m.tenant] && !m.at.Before(from) && m.at.Before(to) {
			g.produced++
		}
	}
	return g
}

// explained is what explains an order inversion: what the children
// recorded (per place in the source, each delivery of it, whether NATS
// said it was a redelivery, whether the engine reported handling it ahead
// of its lane's head; when each process lost each partition) and what the
// scenario did (which process it killed when, when it restarted the
// broker).
type explained struct {
	deliveries  map[place][]eventLine
	redelivered map[place]bool
	reordered   map[place]bool
	revoked     map[string][]time.Time // by process and partition (revokeKey)
	killed      map[string]time.Time   // by process
	restarts    []time.Time
}

func revokeKey(proc string, partition int32) string { return proc + "/" + strconv.Itoa(int(partition)) }

func explanations(evs []eventLine, killed map[string]time.Time, restarts []time.Time) explained {
	ex := explained{deliveries: map[place][]eventLine{}, redelivered: map[place]bool{}, reordered: map[place]bool{},
		revoked: map[string][]time.Time{}, killed: killed, restarts: restarts}
	for _, e := range evs {
		p := place{e.partition, e.offset}
		switch e.kind {
		case "delivered":
			ex.deliveries[p] = append(ex.deliveries[p], e)
		case "redelivered":
			ex.redelivered[p] = true
		case "reordered":
			ex.reordered[p] = true
		case "partition-revoked":
			k := revokeKey(e.proc, e.partition)
			ex.revoked[k] = append(ex.revoked[k], e.at)
		}
	}
	return ex
}

// cutShort reports whether delivery d was cut short before at: its
// process killed, its partition revoked from it, or the broker restarted
// in between.
func (ex explained) cutShort(d eventLine, at time.Time) bool {
	within := func(t time.Time) bool { return t.After(d.at) && t.Before(at) }
	if k, ok := ex.killed[d.proc]; ok && within(k) {
		return true
	}
	for _, t := range ex.revoked[revokeKey(d.proc, d.partition)] {
		if within(t) {
			return true
		}
	}
	for _, t := range ex.restarts {
		if within(t) {
			return true
		}
	}
	return false
}

// redelivery reports whether the source delivered h's message again, after
// an earlier delivery that a kill, a revocation or the broker's restart
// cut short, or NATS says it redelivered it.
func (ex explained) redelivery(h handledLine) bool {
	p := place{h.partition, h.offset}
	if ex.redelivered[p] {
		return true
	}
	for _, d := range ex.deliveries[p] {
		if d.at.Before(h.at) && ex.cutShort(d, h.at) {
			return true
		}
	}
	return false
}

// inversions counts a scope's order inversions by cause.
type inversions struct {
	firsts                 int
	redelivered, reordered int
	unexplained            []string
}

func (v inversions) total() int { return v.redelivered + v.reordered + len(v.unexplained) }

// countInversions walks the first handlings of every id in handling order
// and counts those that come after a later message of the same tenant: in
// scope "tenant" later in produce order (ids grow as they are produced),
// in scope "partition" at a higher offset of the same source partition.
// An inversion is explained by a reorder when the engine reported the late
// message or the one handled ahead of it as reordered, else by a
// redelivery when the late message was delivered again after a kill, a
// revocation or the broker's restart (see redelivery); else it is
// unexplained.
func countInversions(hs []handledLine, scope string, ex explained) inversions {
	var v inversions
	seen := map[string]bool{}
	ahead := map[string]handledLine{} // by group: the first handling furthest ahead so far
	order := func(h handledLine) int64 {
		if scope == "tenant" {
			n, _ := strconv.ParseInt(h.id, 10, 64)
			return n
		}
		return h.offset
	}
	for _, h := range hs {
		if seen[h.id] {
			continue
		}
		seen[h.id] = true
		v.firsts++
		g := h.tenant
		if scope == "partition" {
			g += "/" + strconv.Itoa(int(h.partition))
		}
		a, ok := ahead[g]
		if !ok || order(h) > order(a) {
			ahead[g] = h
			continue
		}
		hp, ap := place{h.partition, h.offset}, place{a.partition, a.offset}
		switch {
		case ex.reordered[hp] || ex.reordered[ap]:
			v.reordered++
		case ex.redelivery(h):
			v.redelivered++
		default:
			v.unexplained = append(v.unexplained, fmt.Sprintf("%s: id %s (partition %d offset %d, by %s) after id %s (offset %d, by %s)",
				h.tenant, h.id, h.partition, h.offset, h.proc, a.id, a.offset, a.proc))
		}
	}
	return v
}

// sameOwnerGaps summarises, per source partition, the longest gap between
// two consecutive handlings (the failing tenant's left out) by the same
// process, from steady on: the pause a partition that did not change owner
// saw in a rebalance. Gaps that overlap the broker's restart are reported
// apart.
func sameOwnerGaps(hs []handledLine, failing string, steady, restartFrom, restartTo time.Time) string {
	last := map[int32]handledLine{}
	longest := map[int32]time.Duration{}
	var restartGap time.Duration
	for _, h := range hs {
		if h.tenant == failing {
			continue
		}
		prev, ok := last[h.partition]
		last[h.partition] = h
		if !ok || prev.proc != h.proc || prev.at.Before(steady) {
			continue
		}
		gap := h.at.Sub(prev.at)
		if prev.at.Before(restartTo) && h.at.After(restartFrom) {
			restartGap = max(restartGap, gap)
			continue
		}
		longest[h.partition] = max(longest[h.partition], gap)
	}
	parts := make([]int32, 0, len(longest))
	for p := range longest {
		parts = append(parts, p)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
	var b strings.Builder
	var top time.Duration
	for _, p := range parts {
		fmt.Fprintf(&b, "p%d=%.2fs ", p, longest[p].Seconds())
		top = max(top, longest[p])
	}
	fmt.Fprintf(&b, "max=%.2fs across-broker-restart=%.2fs", top.Seconds(), restartGap.Seconds())
	return b.String()
}

// revokedAndKept counts, from steady on and leaving out the broker's
// restart, the revocations of a partition whose next assignment went to the
// same process (a rebalance that stopped a partition without moving it),
// and the longest time from such a revocation to that assignment.
func revokedAndKept(evs []eventLine, steady, restartFrom, restartTo time.Time) (int, time.Duration) {
	evs = slices.Clone(evs)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	revoked := map[int32]eventLine{}
	n, longest := 0, time.Duration(0)
	for _, e := range evs {
		if e.at.Before(steady) {
			continue
		}
		switch e.kind {
		case "partition-revoked":
			revoked[e.partition] = e
		case "partition-assigned":
			r, ok := revoked[e.partition]
			delete(revoked, e.partition)
			if !ok || r.proc != e.proc || (r.at.Before(restartTo) && e.at.After(restartFrom)) {
				continue
			}
			n++
			longest = max(longest, e.at.Sub(r.at))
		}
	}
	return n, longest
}

// TestCountInversions holds the inversion count to what it must catch and
// how it must classify it.
func TestCountInversions(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	h := func(id string, off int64, sec int) handledLine {
		return handledLine{id: id, tenant: "t", partition: 0, offset: off, proc: "c2", at: at(sec)}
	}
	other := handledLine{id: "100", tenant: "u", partition: 0, offset: 0, proc: "c2", at: at(0)}
	late := []handledLine{h("1", 1, 1), h("3", 3, 2), h("2", 2, 10)} // 2 handled after 3
	delivered := func(proc string, sec int) eventLine {
		return eventLine{kind: "delivered", tenant: "t", partition: 0, offset: 2, proc: proc, at: at(sec)}
	}
	for _, tc := range []struct {
		name        string
		hs          []handledLine
		ex          explained
		redelivered int
		reordered   int
		unexplained int
	}{
		{name: "in order", hs: []handledLine{h("1", 1, 1), other, h("2", 2, 2), h("3", 3, 3)}},
		{name: "handled again", hs: []handledLine{h("1", 1, 1), h("2", 2, 2), h("1", 1, 3), h("3", 3, 4)}},
		{name: "unexplained", hs: late, unexplained: 1},
		{name: "two behind one", hs: []handledLine{h("3", 3, 1), h("1", 1, 2), h("2", 2, 3)}, unexplained: 2},
		{name: "in flight in a killed process", hs: late, redelivered: 1, ex: explained{
			deliveries: map[place][]eventLine{{0, 2}: {delivered("c1", 1), delivered("c2", 9)}},
			killed:     map[string]time.Time{"c1": at(5)}}},
		{name: "delivered to a process killed after it was handled", hs: late, unexplained: 1, ex: explained{
			deliveries: map[place][]eventLine{{0, 2}: {delivered("c1", 1), delivered("c2", 9)}},
			killed:     map[string]time.Time{"c1": at(11)}}},
		{name: "in a revoked partition", hs: late, redelivered: 1, ex: explained{
			deliveries: map[place][]eventLine{{0, 2}: {delivered("c1", 1), delivered("c2", 9)}},
			revoked:    map[string][]time.Time{revokeKey("c1", 0): {at(4)}}}},
		{name: "across the broker's restart", hs: late, redelivered: 1, ex: explained{
			deliveries: map[place][]eventLine{{0, 2}: {delivered("c2", 1), delivered("c2", 9)}},
			restarts:   []time.Time{at(6)}}},
		{name: "delivered twice, nothing cut it short", hs: late, unexplained: 1, ex: explained{
			deliveries: map[place][]eventLine{{0, 2}: {delivered("c1", 1), delivered("c2", 9)}}}},
		{name: "redelivered by the server", hs: late, redelivered: 1, ex: explained{redelivered: map[place]bool{{0, 2}: true}}},
		{name: "the one ahead reordered", hs: late, reordered: 1, ex: explained{reordered: map[place]bool{{0, 3}: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, scope := range []string{"tenant", "partition"} {
				v := countInversions(tc.hs, scope, tc.ex)
				if v.redelivered != tc.redelivered || v.reordered != tc.reordered || len(v.unexplained) != tc.unexplained {
					t.Errorf("scope %s: redelivered %d, reordered %d, unexplained %v; want %d, %d, %d",
						scope, v.redelivered, v.reordered, v.unexplained, tc.redelivered, tc.reordered, tc.unexplained)
				}
			}
		})
	}
}

// TestRevokedAndKept holds the count of rebalances that stopped a
// partition without moving it.
func TestRevokedAndKept(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ev := func(kind, proc string, part int32, ms int) eventLine {
		return eventLine{kind: kind, tenant: "-", proc: proc, partition: part, at: at(ms)}
	}
	evs := []eventLine{
		ev("partition-assigned", "c1", 0, 0), // before steady
		ev("partition-revoked", "c1", 0, 1000),
		ev("partition-revoked", "c2", 1, 1000),
		ev("partition-assigned", "c1", 0, 3500), // kept: 2.5s
		ev("partition-assigned", "c1", 1, 3500), // moved
		ev("partition-revoked", "c1", 0, 9000),  // across the restart
		ev("partition-assigned", "c1", 0, 12000),
	}
	n, longest := revokedAndKept(evs, at(500), at(10000), at(11000))
	if n != 1 || longest != 2500*time.Millisecond {
		t.Errorf("got %d kept, longest %v; want 1, 2.5s", n, longest)
	}
}

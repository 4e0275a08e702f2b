package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ringfence/ringfence/internal/brokertest"
)

// Sizes of the spill scenario. The noisy tenant produces noisyPerRound
// messages per round and each other tenant one, a round every
// spillRoundEvery, for at most spillMaxRounds rounds (the test stops the
// producer earlier, once the last consumer is re-feeding).
const (
	spillNoisy         = "noisy"
	spillNoisyPerRound = 6
	spillRoundEvery    = 100 * time.Millisecond
	spillMaxRounds     = 1200
	spillParkedBound   = 20                // the consumers' MaxParkedPerTenant
	spillPhaseTimeout  = 60 * time.Second  // one phase of the scenario
	spillDrainTimeout  = 120 * time.Second // the last consumer re-feeding everything
)

// TestSpillKillRestart takes one tenant's dependency down (a file the
// consumers poll) so that it spills to its durable spill log, and while
// messages keep arriving: kills the consumer process with SIGKILL while it
// is spilling, restarts the broker container while its successor spills,
// brings the dependency back, kills that consumer with SIGKILL while it is
// re-feeding the spilled messages, and lets a third one finish. Nothing is
// lost, nothing of the tenant is dead-lettered (its fault is a transient
// outage), and in each source partition its messages were first handled in
// the order they were produced.
func TestSpillKillRestart(t *testing.T) {
	for _, kind := range brokerKinds {
		t.Run(kind, func(t *testing.T) { spillKillRestart(t, kind) })
	}
}

func spillKillRestart(t *testing.T, kind string) {
	phase := phaseLog(t)
	r := newRig(t, kind, false)
	fault := filepath.Join(r.dir, "noisy-dependency-down")
	if err := os.WriteFile(fault, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	events := filepath.Join(r.dir, "events.log")
	consumerMod := func(name string) func(*childConfig) {
		return func(c *childConfig) {
			c.WorkMs = 5
			c.FaultTenant, c.FaultFile = spillNoisy, fault
			c.MaxParkedPerTenant = spillParkedBound
			c.Progress = filepath.Join(r.dir, name+".progress")
			c.Events = events
		}
	}
	// A tenant listed k times gets k messages a round.
	round := tenantNames(5)
	for range spillNoisyPerRound {
		round = append(round, spillNoisy)
	}
	stopProducing := make(chan struct{})
	prod := r.produceUntil(round, spillMaxRounds, spillRoundEvery, stopProducing)
	defer func() {
		select {
		case <-stopProducing:
		default:
			close(stopProducing)
		}
	}()

	c1 := r.startConsumer("c1", consumerMod("c1"))
	c1.waitProgress(t, "c1 spilling the noisy tenant", spillPhaseTimeout, func(p childProgress) bool {
		n := p.Tenants[spillNoisy]
		return n.Spilling > 0 && n.Spilled >= 150
	})
	c1.kill(t)
	phase(fmt.Sprintf("c1 killed while spilling (%s)", c1.lastProgress()))

	c2 := r.startConsumer("c2", consumerMod("c2"))
	c2.waitProgress(t, "c2 spilling the noisy tenant", spillPhaseTimeout, func(p childProgress) bool {
		n := p.Tenants[spillNoisy]
		return n.Spilling > 0 && n.Spilled >= 100
	})
	before := c2.progress().Tenants[spillNoisy].Spilled
	phase(fmt.Sprintf("c2 spilling (%s); restarting the broker", c2.lastProgress()))
	r.src.Restart(t)
	phase("broker restarted")
	c2.waitProgress(t, "c2 spilling again after the broker restart", spillPhaseTimeout, func(p childProgress) bool {
		n := p.Tenants[spillNoisy]
		return n.Spilling > 0 && n.Spilled >= before+100
	})
	phase(fmt.Sprintf("c2 spilling after the restart (%s); the noisy dependency recovers", c2.lastProgress()))
	if err := os.Remove(fault); err != nil {
		t.Fatal(err)
	}

	// Killed once it handled some of the spilled messages, with more left
	// in the log (the lane still spilling).
	c2.waitProgress(t, "c2 re-feeding the noisy tenant", spillPhaseTimeout, func(p childProgress) bool {
		n := p.Tenants[spillNoisy]
		return n.Spilling > 0 && n.Refed > 0 && n.Handled >= 100
	})
	c2.kill(t)
	phase(fmt.Sprintf("c2 killed while re-feeding (%s)", c2.lastProgress()))
	if drained := r.spillEvents(events, "spill-drained", "c2"); drained > 0 {
		t.Errorf("c2 drained the noisy tenant's spill log %d times before it was killed: the scenario did not kill it while re-feeding", drained)
	}

	c3 := r.startConsumer("c3", consumerMod("c3"))
	c3.waitProgress(t, "c3 handling the noisy tenant", spillPhaseTimeout, func(p childProgress) bool {
		return p.Tenants[spillNoisy].Handled > 0
	})
	close(stopProducing)
	awaitProducer(t, prod)
	phase(fmt.Sprintf("c3 handling the noisy tenant (%s); producer stopped with %d produced", c3.lastProgress(), r.producedCount()))

	r.waitSettled()
	c3.waitProgress(t, "c3 draining the spill log", spillDrainTimeout, func(p childProgress) bool {
		return p.SpillingTenants == 0
	})
	phase(fmt.Sprintf("settled and drained (%s)", c3.lastProgress()))
	c3.stop(t)

	res := r.reconcile("spill-kill")
	r.mu.Lock()
	produced := make(map[string]msg, len(r.produced))
	for id, m := range r.produced {
		produced[id] = m
	}
	r.mu.Unlock()
	noisyProduced, noisyDead := 0, 0
	for id, m := range produced {
		if m.tenant != spillNoisy {
			continue
		}
		noisyProduced++
		if res.deadIDs[id] > 0 {
			noisyDead++
		}
	}
	if noisyDead > 0 {
		t.Errorf("%d of the noisy tenant's %d messages dead-lettered; its fault was a transient outage", noisyDead, noisyProduced)
	}
	if kind == "nats" {
		t.Logf("the server redelivered %d of the noisy tenant's messages (held by a killed consumer)", r.spillEvents(events, "redelivered", ""))
	}
	r.checkOrder(spillNoisy, r.reorderedOffsets(events))
	if r.spillEvents(events, "spilling", "") == 0 {
		t.Error("no spilling event recorded")
	}
	phase("done")
}

// produceUntil produces a round of messages (one per entry of tenants)
// every interval, until stop is closed or after maxRounds rounds, and
// returns a channel that yields the first error (or nil) when done. Only
// this goroutine allocates ids meanwhile.
func (r *rig) produceUntil(tenants []string, maxRounds int, interval time.Duration, stop <-chan struct{}) <-chan error {
	done := make(chan error, 1)
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for range maxRounds {
			if err := r.tryProduce(r.messages(tenants, 1, nil)); err != nil {
				done <- err
				return
			}
			select {
			case <-stop:
				done <- nil
				return
			case <-tick.C:
			}
		}
		done <- nil
	}()
	return done
}

// progressFile is where a child of the spill scenario writes its progress.
func (p *proc) progressFile() string {
	return strings.TrimSuffix(p.log, ".log") + ".progress"
}

// progress returns the child's last progress report (zero before its
// first).
func (p *proc) progress() childProgress {
	var cp childProgress
	raw, err := os.ReadFile(p.progressFile())
	if err != nil {
		return cp
	}
	_ = json.Unmarshal(raw, &cp)
	return cp
}

// lastProgress summarises the child's last progress report for the log.
func (p *proc) lastProgress() string {
	cp := p.progress()
	n := cp.Tenants[spillNoisy]
	return fmt.Sprintf("%s: handled=%d spilled=%d refed=%d spill_failures=%d; noisy: handled=%d spilled=%d refed=%d spill_lag=%d spilling=%d parked=%d",
		p.name, cp.Handled, cp.Spilled, cp.Refed, cp.SpillFailures, n.Handled, n.Spilled, n.Refed, n.SpillLag, n.Spilling, n.Parked)
}

// waitProgress polls (bounded) the child's progress until cond holds,
// failing the test if the child exits first.
func (p *proc) waitProgress(t *testing.T, what string, timeout time.Duration, cond func(childProgress) bool) {
	t.Helper()
	err := brokertest.PollUntil(context.Background(), timeout, 50*time.Millisecond, func(context.Context) error {
		select {
		case <-p.done:
			return fmt.Errorf("consumer %s exited: %v", p.name, p.err)
		default:
		}
		if !cond(p.progress()) {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (last: %s)", what, err, p.lastProgress())
	}
}

// eventLine is one line of the children's event file (see eventSink).
type eventLine struct {
	kind, tenant, proc string
	partition          int32
	offset             int64
	at                 time.Time
}

func readEvents(t *testing.T, path string) []eventLine {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []eventLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 6 {
			continue // a torn last line of a killed process
		}
		part, _ := strconv.ParseInt(fs[2], 10, 32)
		off, _ := strconv.ParseInt(fs[3], 10, 64)
		ns, _ := strconv.ParseInt(fs[5], 10, 64)
		out = append(out, eventLine{kind: fs[0], tenant: fs[1], partition: int32(part), offset: off, proc: fs[4], at: time.Unix(0, ns)})
	}
	return out
}

// spillEvents counts the noisy tenant's events of kind (by proc, or by any
// when proc is "").
func (r *rig) spillEvents(path, kind, proc string) int {
	return r.countEvents(path, kind, spillNoisy, proc)
}

// countEvents counts the events of kind in path, of tenant and by proc
// ("" for any).
func (r *rig) countEvents(path, kind, tenant, proc string) int {
	n := 0
	for _, e := range readEvents(r.t, path) {
		if e.kind == kind && (tenant == "" || e.tenant == tenant) && (proc == "" || e.proc == proc) {
			n++
		}
	}
	return n
}

// place is a message's partition and offset in its source.
type place struct {
	partition int32
	offset    int64
}

// reorderedOffsets returns the noisy tenant's messages whose order is not
// promised: those the engine reported handling ahead of their lane's
// suspect head (EventReordered, the one reordering it documents), and on
// NATS those the server delivered more than once (see redeliveries).
func (r *rig) reorderedOffsets(path string) map[place]bool {
	out := map[place]bool{}
	for _, e := range readEvents(r.t, path) {
		if (e.kind == "reordered" || e.kind == "redelivered") && e.tenant == spillNoisy {
			out[place{e.partition, e.offset}] = true
		}
	}
	return out
}

// orderReport is what checkOrder found.
type orderReport struct {
	firsts  map[int32]int // first handlings checked, per partition
	dups    int           // later handlings of an id, left out
	skipped int           // first handlings of reordered messages, left out
	bad     []string      // first handlings below an earlier one's offset
}

// orderOf checks that in each source partition the first handlings of
// tenant's messages in hs (in handling order) are in offset order, that is
// in the order they were produced: later handlings of an id (redeliveries
// after a kill, copies re-fed again) and the messages in reordered are
// left out.
func orderOf(hs []handledLine, tenant string, reordered map[place]bool) orderReport {
	rep := orderReport{firsts: map[int32]int{}}
	seen := map[string]bool{}
	last := map[int32]int64{}
	for _, h := range hs {
		if h.tenant != tenant {
			continue
		}
		if seen[h.id] {
			rep.dups++
			continue
		}
		seen[h.id] = true
		if reordered[place{h.partition, h.offset}] {
			rep.skipped++
			continue
		}
		if prev, ok := last[h.partition]; ok && h.offset <= prev {
			rep.bad = append(rep.bad, fmt.Sprintf("id %s at partition %d offset %d (by %s) after offset %d", h.id, h.partition, h.offset, h.proc, prev))
		}
		last[h.partition] = h.offset
		rep.firsts[h.partition]++
	}
	return rep
}

// checkOrder fails the test unless tenant's messages were first handled in
// their source order (see orderOf).
func (r *rig) checkOrder(tenant string, reordered map[place]bool) {
	r.t.Helper()
	rep := orderOf(r.handled(), tenant, reordered)
	r.t.Logf("order of %s: first handlings per partition %v, %d later handlings of the same ids, %d left out (reordered or redelivered)", tenant, rep.firsts, rep.dups, rep.skipped)
	if len(rep.firsts) == 0 {
		r.t.Errorf("order of %s: nothing handled", tenant)
	}
	if len(rep.bad) > 0 {
		r.t.Errorf("order of %s: %d messages first handled out of their source order, e.g. %v", tenant, len(rep.bad), rep.bad[:min(5, len(rep.bad))])
	}
}

// TestOrderOf holds the order check to what it must catch and what it must
// let pass.
func TestOrderOf(t *testing.T) {
	h := func(id string, part int32, off int64) handledLine {
		return handledLine{id: id, tenant: "noisy", partition: part, offset: off, proc: "c"}
	}
	other := handledLine{id: "x", tenant: "other", partition: 0, offset: 1, proc: "c"}
	for _, tc := range []struct {
		name      string
		hs        []handledLine
		reordered map[place]bool
		bad       int
		dups      int
	}{
		{name: "in order", hs: []handledLine{h("1", 0, 1), h("2", 0, 2), other, h("3", 0, 5)}},
		{name: "partitions apart", hs: []handledLine{h("1", 0, 7), h("2", 1, 1), h("3", 0, 8), h("4", 1, 2)}},
		{name: "redelivered after a kill", hs: []handledLine{h("1", 0, 1), h("2", 0, 2), h("1", 0, 1), h("2", 0, 2), h("3", 0, 3)}, dups: 2},
		{name: "a later copy in the source log", hs: []handledLine{h("1", 0, 1), h("2", 0, 2), h("1", 0, 3), h("3", 0, 4)}, dups: 1},
		{name: "out of order", hs: []handledLine{h("1", 0, 1), h("3", 0, 3), h("2", 0, 2), h("4", 0, 4)}, bad: 1},
		{name: "reported reordered", hs: []handledLine{h("1", 0, 1), h("3", 0, 3), h("2", 0, 2), h("4", 0, 4)}, reordered: map[place]bool{{0, 3}: true}},
		{name: "a duplicate offset with a new id", hs: []handledLine{h("1", 0, 1), h("2", 0, 1)}, bad: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := orderOf(tc.hs, "noisy", tc.reordered)
			if len(rep.bad) != tc.bad || rep.dups != tc.dups {
				t.Errorf("bad %v, dups %d; want %d bad, %d dups", rep.bad, rep.dups, tc.bad, tc.dups)
			}
		})
	}
}

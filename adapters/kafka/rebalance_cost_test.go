package kafka

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// TestRebalanceCost measures what a member leaving and a member joining a
// 3-member group cost with each source, and prints the table with -v. It
// runs only when RINGFENCE_REBALANCE_COST is set (it takes about half a
// minute):
//
//	RINGFENCE_REBALANCE_COST=1 go test -run TestRebalanceCost -v ./adapters/kafka/
//
// The members are in-process: each its own source, its own client and its
// own consumer.Consumer, on one kfake broker. A producer writes a round of
// one message per tenant every 10ms (24 tenants, each on one of 12
// partitions); one tenant ("sick") fails every call, so its messages park.
// It asserts that no message is lost, and that no source has a message
// handled twice on a partition other than the sick tenant's.
//
// Per event (from it to the next): how many partitions changed member, and
// how many Revoked calls the members' engines got;
// the longest time between two handlings of a partition that kept its
// member (from 1s before the event), beside the longest in the steady 2s
// before the first event; messages handled, and delivered by a source,
// more than once; for every partition a member gave away (revoked, or the
// leaver's), the offsets past its commit point then (what its next owner
// reads again: the most that can be handled twice) and the sick tenant's
// parked messages among them (their breaker's wait starts again).
//
// The figures of messages handled twice, delivered again and offsets
// given away come in two parts: on the sick tenant's partition, and on
// every other partition. With no spill log the sick tenant's partition's
// commit point stays at its oldest parked message, so whichever member
// gets that partition next reads it again from there and handles twice
// every healthy message past it, with any protocol. Whether a leave or a
// join moves that partition is up to the assignment, so that part differs
// from run to run; the part on the other partitions is what the rebalance
// itself gives away, and compares across runs and sources.
func TestRebalanceCost(t *testing.T) {
	if os.Getenv("RINGFENCE_REBALANCE_COST") == "" {
		t.Skip("set RINGFENCE_REBALANCE_COST=1 to measure rebalances")
	}
	c := startCluster(t)
	opts := fastOpts(WithCommitInterval(time.Second))
	kinds := []struct {
		name string
		src  func(topic, group string) (consumer.Source, error)
	}{
		{"kafka-go Source (eager)", func(topic, group string) (consumer.Source, error) {
			return NewSource(c.Addrs(), topic, group, opts...)
		}},
		{"kgo GroupSource (cooperative)", func(topic, group string) (consumer.Source, error) {
			return NewGroupSource(c.Addrs(), topic, group, opts...)
		}},
		{"kgo GroupSource (KIP-848)", func(topic, group string) (consumer.Source, error) {
			return NewGroupSource(c.Addrs(), topic, group, append(opts, WithClientOptions(kgo.ServerSideBalancer()))...)
		}},
	}
	var rows []costRow
	for _, k := range kinds {
		rows = append(rows, measureRebalance(t, c.Addrs(), k.name, k.src))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| source | event | partitions moved | partitions revoked | longest stop of a partition that stayed | steady longest gap "+
		"| handled twice (other partitions) | handled twice (sick tenant's partition) "+
		"| delivered again (other partitions) | delivered again (sick tenant's partition) "+
		"| uncommitted offsets given away (other partitions) | uncommitted offsets given away (sick tenant's partition) "+
		"| parked messages dropped |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		for _, e := range r.events {
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %v | %v | %d | %d | %d | %d | %d | %d | %d |\n", r.name, e.name, e.moved, e.revokes,
				e.stop.Round(time.Millisecond), r.steady.Round(time.Millisecond),
				e.twice.other, e.twice.sick, e.again.other, e.again.sick, e.dropped.other, e.dropped.sick, e.parked)
		}
	}
	t.Log(b.String())
	// A member's engine commits what it handled when a partition is
	// revoked from it and when it drains before leaving, so a partition's
	// next owner handles nothing twice unless a parked message holds the
	// partition's commit point back. (A source may still deliver again
	// what the member fetched but never handled.)
	for _, r := range rows {
		for _, e := range r.events {
			if e.twice.other != 0 {
				t.Errorf("%s, %s: %d messages handled twice on the partitions other than the sick tenant's, want 0", r.name, e.name, e.twice.other)
			}
		}
	}
}

type costRow struct {
	name   string
	steady time.Duration
	events []costEvent
}

type costEvent struct {
	name         string
	moved        int
	revokes      int // Revoked calls, all members
	stop         time.Duration
	twice, again costSplit
	dropped      costSplit // offsets past the commit point of the partitions given away
	parked       int       // the sick tenant's parked messages among them
}

// costSplit is a count in two parts: on the sick tenant's partition,
// whose commit point its parked head holds back, and on every other
// partition.
type costSplit struct{ other, sick int }

func (s *costSplit) add(p int32, n int) {
	if p == costPartition(costSick) {
		s.sick += n
	} else {
		s.other += n
	}
}

func (s costSplit) minus(o costSplit) costSplit {
	return costSplit{s.other - o.other, s.sick - o.sick}
}

const (
	costParts   = 12
	costTenants = 24
	costSick    = "tenant-00"
)

// handling is one handled message.
type handling struct {
	at     time.Time
	member int
}

// costRun is what all members of one run record.
type costRun struct {
	mu        sync.Mutex
	handled   map[string]int       // value -> times handled
	byPart    map[int32][]handling // partition -> handlings, in time order
	delivered map[string]int       // value -> times delivered by a source
	dropped   costSplit            // see costEvent
	parked    int                  // see costEvent
	revokes   int                  // Revoked calls, all members
}

// costSnap is the run's counters at one moment.
type costSnap struct {
	twice, again, dropped costSplit
	parked, revokes       int
}

func (r *costRun) snap() costSnap {
	r.mu.Lock()
	defer r.mu.Unlock()
	return costSnap{countTwice(r.handled), countTwice(r.delivered), r.dropped, r.parked, r.revokes}
}

func (e *costEvent) between(a, b costSnap) {
	e.twice, e.again, e.dropped = b.twice.minus(a.twice), b.again.minus(a.again), b.dropped.minus(a.dropped)
	e.parked, e.revokes = b.parked-a.parked, b.revokes-a.revokes
}

// costMember is one in-process member.
type costMember struct {
	cons   *consumer.Consumer
	cancel context.CancelFunc
	done   chan error
}

// costSource wraps a source to see what it delivers and revokes.
type costSource struct {
	consumer.Source
	run  *costRun
	cons atomic.Pointer[consumer.Consumer]
}

func (s *costSource) SettleIsNoop() bool { return true }

func (s *costSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	return s.Source.Run(ctx, &costDispatcher{Dispatcher: d, s: s})
}

type costDispatcher struct {
	consumer.Dispatcher
	s *costSource
}

func (d *costDispatcher) DeliverBatch(ms []*consumer.Message) {
	d.s.run.mu.Lock()
	for _, m := range ms {
		d.s.run.delivered[string(m.Value)]++
	}
	d.s.run.mu.Unlock()
	d.Dispatcher.DeliverBatch(ms)
}

func (d *costDispatcher) Deliver(m *consumer.Message) { d.DeliverBatch([]*consumer.Message{m}) }

func (d *costDispatcher) Revoked(p consumer.Partition) {
	d.s.run.mu.Lock()
	d.s.run.revokes++
	d.s.run.mu.Unlock()
	if c := d.s.cons.Load(); c != nil {
		d.s.run.giveUp(c, func(q consumer.Partition) bool { return q == p })
	}
	d.Dispatcher.Revoked(p)
}

// giveUp counts what c's partitions that match are about to give away: the
// offsets past their commit point (what the next owner reads again) and
// the sick tenant's parked messages among them.
func (r *costRun) giveUp(c *consumer.Consumer, match func(consumer.Partition) bool) {
	st := c.Stats()
	var lag costSplit
	parked := 0
	for _, ps := range st.Partitions {
		if !match(ps.Partition) {
			continue
		}
		lag.add(ps.Partition.ID, int(ps.CommitLag))
		if ps.Partition.ID == costPartition(costSick) {
			ts, _ := c.Tenant(costSick)
			parked += ts.Parked
		}
	}
	r.mu.Lock()
	r.dropped.other += lag.other
	r.dropped.sick += lag.sick
	r.parked += parked
	r.mu.Unlock()
}

// costPartition is the partition of a tenant, or of one of its messages'
// values ("tenant-07-123").
func costPartition(tenant string) int32 {
	var i int
	fmt.Sscanf(tenant, "tenant-%d", &i)
	return int32(i % costParts)
}

var errSick = errors.New("sick tenant's dependency is down")

func measureRebalance(t *testing.T, addrs []string, name string, newSource func(topic, group string) (consumer.Source, error)) costRow {
	t.Helper()
	topic, group := uniq("cost"), uniq("g")
	cl := &kafkago.Client{Addr: kafkago.TCP(addrs...)}
	if err := createTopic(testCtx(t, 10*time.Second), cl, topic, costParts, -1); err != nil {
		t.Fatal(err)
	}
	run := &costRun{handled: map[string]int{}, byPart: map[int32][]handling{}, delivered: map[string]int{}}

	start := func(idx int) *costMember {
		src, err := newSource(topic, group)
		if err != nil {
			t.Fatal(err)
		}
		cs := &costSource{Source: src, run: run}
		cons, err := consumer.New(consumer.Config{
			Tenant: consumer.FromKey(),
			DLQ:    dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil }),
			Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
				if string(m.Key) == costSick {
					return errSick
				}
				run.mu.Lock()
				run.handled[string(m.Value)]++
				run.byPart[m.Partition.ID] = append(run.byPart[m.Partition.ID], handling{time.Now(), idx})
				run.mu.Unlock()
				return nil
			}),
		})
		if err != nil {
			t.Fatal(err)
		}
		cs.cons.Store(cons)
		ctx, cancel := context.WithCancel(context.Background())
		m := &costMember{cons: cons, cancel: cancel, done: make(chan error, 1)}
		go func() { m.done <- cons.Run(ctx, cs) }()
		return m
	}
	stop := func(m *costMember) {
		m.cancel()
		select {
		case err := <-m.done:
			if err != nil {
				t.Errorf("member Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("member did not stop within 30s")
		}
	}

	// The producer: a round every 10ms, the sick tenant every 10th round.
	prod, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var produced atomic.Int64 // healthy messages acknowledged
	pctx, pcancel := context.WithCancel(context.Background())
	pdone := make(chan struct{})
	go func() {
		defer close(pdone)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for round := 0; round < 6000; round++ { // at most a minute
			var recs []*kgo.Record
			for i := range costTenants {
				tn := fmt.Sprintf("tenant-%02d", i)
				if tn == costSick && round%10 != 0 {
					continue
				}
				recs = append(recs, &kgo.Record{Topic: topic, Partition: costPartition(tn), Key: []byte(tn), Value: []byte(fmt.Sprintf("%s-%d", tn, round))})
			}
			if err := prod.ProduceSync(pctx, recs...).FirstErr(); err != nil {
				if pctx.Err() == nil {
					t.Errorf("produce: %v", err)
				}
				return
			}
			for _, r := range recs {
				if string(r.Key) != costSick {
					produced.Add(1)
				}
			}
			select {
			case <-pctx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	// flowing: every partition handled within the last 300ms, the handler
	// of each the one wanted (nil: any).
	flowing := func(want func(member int) bool) func() bool {
		return func() bool {
			run.mu.Lock()
			defer run.mu.Unlock()
			for p := range int32(costParts) {
				hs := run.byPart[p]
				if len(hs) == 0 || time.Since(hs[len(hs)-1].at) > 300*time.Millisecond || !want(hs[len(hs)-1].member) {
					return false
				}
			}
			return true
		}
	}
	any := func(int) bool { return true }
	wait := testCtx(t, 2*time.Minute)

	members := []*costMember{start(0), start(1), start(2)}
	eventually(t, wait, "three members flowing", func() bool {
		if !flowing(any)() {
			return false
		}
		run.mu.Lock()
		defer run.mu.Unlock()
		seen := map[int]bool{}
		for _, hs := range run.byPart {
			seen[hs[len(hs)-1].member] = true
		}
		return len(seen) == 3
	})
	time.Sleep(2 * time.Second) // steady state, measured below
	s0 := run.snap()
	tLeave := time.Now()
	// The leaver's engine drains and commits before its source leaves:
	// what its partitions lag then is read again by their new owners.
	run.giveUp(members[2].cons, func(consumer.Partition) bool { return true })
	stop(members[2])
	eventually(t, wait, "two members flowing", flowing(func(m int) bool { return m != 2 }))
	time.Sleep(2 * time.Second)
	s1 := run.snap()
	tJoin := time.Now()
	members = append(members, start(3))
	eventually(t, wait, "the new member flowing", func() bool {
		if !flowing(any)() {
			return false
		}
		run.mu.Lock()
		defer run.mu.Unlock()
		for _, hs := range run.byPart {
			if hs[len(hs)-1].member == 3 {
				return true
			}
		}
		return false
	})
	time.Sleep(2 * time.Second)
	tEnd := time.Now()
	pcancel()
	<-pdone
	eventually(t, wait, "every healthy message handled", func() bool {
		run.mu.Lock()
		defer run.mu.Unlock()
		return int64(len(run.handled)) >= produced.Load()
	})
	s2 := run.snap()
	for _, m := range []*costMember{members[0], members[1], members[3]} {
		stop(m)
	}

	run.mu.Lock()
	defer run.mu.Unlock()
	if int64(len(run.handled)) != produced.Load() {
		t.Fatalf("%s: %d distinct messages handled, %d produced", name, len(run.handled), produced.Load())
	}
	row := costRow{name: name, steady: longestGap(run.byPart, tLeave.Add(-2*time.Second), tLeave, nil)}
	leave := costEvent{name: "member leaves (Close)"}
	join := costEvent{name: "member joins"}
	leave.moved, leave.stop = stayedStop(run.byPart, tLeave, tJoin)
	join.moved, join.stop = stayedStop(run.byPart, tJoin, tEnd)
	leave.between(s0, s1)
	join.between(s1, s2)
	row.events = []costEvent{leave, join}
	return row
}

// countTwice counts the values seen more than once (each extra time), by
// the partition of the value's tenant.
func countTwice(m map[string]int) costSplit {
	var n costSplit
	for v, c := range m {
		if c > 1 {
			n.add(costPartition(v), c-1)
		}
	}
	return n
}

// longestGap is the longest time between two handlings of a partition
// within [from, to), over the partitions keep accepts (nil: all).
func longestGap(byPart map[int32][]handling, from, to time.Time, keep func(p int32) bool) time.Duration {
	var longest time.Duration
	for p, hs := range byPart {
		if keep != nil && !keep(p) {
			continue
		}
		var last time.Time
		for _, h := range hs {
			if h.at.Before(from) {
				last = h.at
				continue
			}
			if !h.at.Before(to) {
				break
			}
			if !last.IsZero() {
				longest = max(longest, h.at.Sub(last))
			}
			last = h.at
		}
	}
	return longest
}

// stayedStop returns how many partitions changed owner between event and
// end, and the longest stop of those that did not.
func stayedStop(byPart map[int32][]handling, event, end time.Time) (int, time.Duration) {
	stayed := map[int32]bool{}
	moved := 0
	for p, hs := range byPart {
		before, after := -1, -1
		for _, h := range hs {
			if h.at.Before(event) {
				before = h.member
			} else if h.at.Before(end) {
				after = h.member
			}
		}
		if before == after {
			stayed[p] = true
		} else {
			moved++
		}
	}
	return moved, longestGap(byPart, event.Add(-time.Second), end, func(p int32) bool { return stayed[p] })
}

package kafka

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/scope"
)

// manyTenants is the shape of TestSpillManyTenantsAtOnce.
type manyTenants struct {
	tenants, partitions int
	lead, fault, tail   time.Duration
}

// spillSoakEnv runs TestSpillManyTenantsAtOnce at full size: 1,000 tenants
// failing for 30s.
const spillSoakEnv = "RINGFENCE_SPILL_SOAK"

// Every tenant fails at once, each sending a message a second, so every
// lane spills: the broker-side footprint stays two topics with the source's
// partition count, every message is handled, in order per tenant (but for
// the messages the engine announces it handled ahead of a suspect head,
// EventReordered, the one reordering it documents), nothing is lost or
// dead-lettered, and the group's commit moves on through the fault. The
// normal run has 1,000 tenants and a 4s fault (-short: 200);
// RINGFENCE_SPILL_SOAK=1 runs a 30s fault and asserts the commit lag bound;
// RINGFENCE_SPILL_SOAK_PARTITIONS sets the source's partition count (4).
func TestSpillManyTenantsAtOnce(t *testing.T) {
	t.Parallel()
	shape := manyTenants{tenants: 1000, partitions: 4, lead: 2 * time.Second, fault: 4 * time.Second, tail: 2 * time.Second}
	soak := os.Getenv(spillSoakEnv) != ""
	switch {
	case soak:
		shape.fault = 30 * time.Second
	case testing.Short():
		shape.tenants = 200
	}
	if n, err := strconv.Atoi(os.Getenv(spillSoakEnv + "_PARTITIONS")); err == nil && n > 0 {
		shape.partitions = n
	}
	c := startCluster(t)
	h := newHarness(t, c)
	h.parts = shape.partitions
	h.topic = uniq("many")
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	ctx := testCtx(t, 10*time.Minute)
	if err := createTopic(ctx, cl, h.topic, shape.partitions, -1); err != nil {
		t.Fatal(err)
	}
	spill, err := NewSpillLog(c.Addrs(), h.topic, h.group)
	if err != nil {
		t.Fatal(err)
	}
	defer spill.Close()

	tenants := make([]string, shape.tenants)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("tenant-%04d", i)
	}
	partOf := func(tn string) int {
		f := fnv.New32a()
		_, _ = f.Write([]byte(tn))
		return int(f.Sum32() % uint32(shape.partitions))
	}

	var failing atomic.Bool
	var mu sync.Mutex
	// handled is each tenant's messages in handling order: a sequence
	// number, and where the message was (partition, offset). reordered
	// holds where the messages are that the engine handled ahead of a
	// suspect head, as evidence (EventReordered): the order check leaves
	// them out.
	type msgPos struct {
		partition int32
		offset    int64
	}
	type handledMsg struct {
		seq int
		at  msgPos
	}
	handled := map[string][]handledMsg{}
	reordered := map[msgPos]bool{}
	cons, err := consumer.New(consumer.Config{
		Scope:              scope.New(consumertest.FastPolicy(), scope.Options[string]{MaxKeys: 4 * shape.tenants}),
		Tenant:             h.Tenant(),
		DLQ:                h.dlq,
		Spill:              spill,
		MaxParkedPerTenant: 2,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if failing.Load() {
				return errStuck
			}
			tn, seq, ok := strings.Cut(string(m.Value), "#")
			n, err := strconv.Atoi(seq)
			if !ok || err != nil {
				return fmt.Errorf("bad value %q", m.Value)
			}
			mu.Lock()
			handled[tn] = append(handled[tn], handledMsg{n, msgPos{m.Partition.ID, m.Offset}})
			mu.Unlock()
			return nil
		}),
		OnEvent: func(e consumer.Event) {
			if e.Kind == consumer.EventReordered {
				mu.Lock()
				reordered[msgPos{e.Partition.ID, e.Offset}] = true
				mu.Unlock()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx, h.source(t)) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// Traffic: one message a second per tenant through lead, fault and
	// tail; the fault starts after lead.
	var lagMax, lagSamples atomic.Int64
	sampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		// The group's commit lag, every 200ms while the fault lasts.
		defer close(sampled)
		for {
			select {
			case <-sampling:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if !failing.Load() {
				continue
			}
			lag := groupLag(t, cl, h.group, h.topic, shape.partitions)
			lagSamples.Add(1)
			if lag > lagMax.Load() {
				lagMax.Store(lag)
			}
		}
	}()
	seconds := int((shape.lead + shape.fault + shape.tail) / time.Second)
	start := time.Now()
	for sec := range seconds {
		var batch []kafkago.Message
		for _, tn := range tenants {
			batch = append(batch, kafkago.Message{
				Partition: partOf(tn), Value: []byte(fmt.Sprintf("%s#%d", tn, sec)),
				Headers: []kafkago.Header{{Key: tenantHeader, Value: []byte(tn)}},
			})
		}
		produce(t, c.Addrs(), h.topic, batch...)
		at := time.Duration(sec) * time.Second
		failing.Store(at >= shape.lead && at < shape.lead+shape.fault)
		if wait := time.Until(start.Add(time.Duration(sec+1) * time.Second)); wait > 0 {
			select {
			case <-ctx.Done():
				t.Fatal("timed out producing")
			case <-time.After(wait):
			}
		}
	}
	failing.Store(false)
	close(sampling)
	<-sampled
	total := seconds * shape.tenants
	distinct := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, msgs := range handled {
			seen := map[int]bool{}
			for _, h := range msgs {
				seen[h.seq] = true
			}
			n += len(seen)
		}
		return n
	}
	wait := testCtx(t, 3*time.Minute)
	eventually(t, wait, "every message handled", func() bool { return distinct() == total })
	eventually(t, wait, "every spill lane drained", func() bool { return spill.Stats().Indexed == 0 })
	drained := time.Since(start)

	// Footprint: the topics ringfence made for the source.
	live, err := liveTopics(ctx, kafkago.DefaultDialer, c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	var made []string
	partitions := 0
	for name, sh := range live {
		if strings.HasPrefix(name, h.topic+".") && !strings.HasPrefix(name, h.topic+".dlq") {
			made = append(made, fmt.Sprintf("%s (%d partitions)", name, sh.partitions))
			partitions += sh.partitions
		}
	}
	slices.Sort(made)

	mu.Lock()
	inversions, duplicates := 0, 0
	for _, msgs := range handled {
		last := -1
		seen := map[int]bool{}
		for _, h := range msgs {
			s := h.seq
			if seen[s] {
				duplicates++
				continue
			}
			seen[s] = true
			if reordered[h.at] {
				continue // handled ahead of its suspect head, announced
			}
			if s < last {
				inversions++
			}
			last = max(last, s)
		}
	}
	nReordered := len(reordered)
	mu.Unlock()
	st, ss := cons.Stats(), spill.Stats()
	t.Logf("%d tenants, %d partitions, fault %v: %d messages, handled %d distinct, lost %d, duplicates %d, inversions %d (besides %d messages handled ahead of a suspect head, EventReordered), dead-lettered %d; drained %v after the first message",
		shape.tenants, shape.partitions, shape.fault, total, distinct(), total-distinct(), duplicates, inversions, nReordered, st.DeadLettered, drained.Round(time.Second))
	t.Logf("topics made: %d, %d partitions in all: %s", len(made), partitions, strings.Join(made, ", "))
	t.Logf("group commit lag during the fault (sum over partitions): largest %d of %d samples; fault window traffic %d",
		lagMax.Load(), lagSamples.Load(), int(shape.fault/time.Second)*shape.tenants)
	t.Logf("engine: spilled %d, re-fed %d, duplicates dropped %d; spill log: appended %d in %d produce requests (%d appends coalesced), read %d (%d Reads served without a fetch), %d cursor commits, %d topics created",
		st.Spilled, st.Refed, st.Duplicates, ss.Appended, ss.Produces, ss.Coalesced, ss.Read, ss.AheadHits, ss.Commits, ss.Created)

	if lost := total - distinct(); lost != 0 || inversions != 0 || st.DeadLettered != 0 {
		t.Fatalf("lost %d, inversions %d, dead-lettered %d; want none", lost, inversions, st.DeadLettered)
	}
	if st.Spilled < uint64(shape.tenants) {
		t.Fatalf("spilled %d messages, want at least one per tenant (%d): the test does not measure spilling", st.Spilled, shape.tenants)
	}
	if len(made) != 2 || live[SpillTopic(h.topic)].partitions != shape.partitions || live[SpillCursorTopic(h.topic)].partitions != shape.partitions {
		t.Fatalf("topics made: %q; want the spill and cursor topics, %d partitions each", made, shape.partitions)
	}
	// A restarted process finds nothing left, and drops the cursors the
	// floors made useless.
	fresh, err := NewSpillLog(c.Addrs(), h.topic, h.group)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	for p := range shape.partitions {
		if ls, err := fresh.Pending(ctx, consumer.Partition{Topic: h.topic, ID: int32(p)}); err != nil || len(ls) != 0 {
			t.Fatalf("Pending of partition %d after the drain: %d lanes, %v; want none", p, len(ls), err)
		}
	}
	if st := fresh.Stats(); st.Lanes != 0 || st.Indexed != 0 {
		t.Fatalf("a fresh log indexes %d lanes, %d records after the drain; want none", st.Lanes, st.Indexed)
	}
	if soak {
		// The whole window's traffic is what a log that does not keep up
		// lets the lag reach; half of it is a generous bound.
		if bound := int64(shape.fault/time.Second) * int64(shape.tenants) / 2; lagMax.Load() > bound {
			t.Fatalf("largest commit lag during the fault %d, want at most %d", lagMax.Load(), bound)
		}
	}
}

// groupLag returns the sum over topic's partitions of the high watermark
// minus group's committed offset.
func groupLag(t testing.TB, cl *kafkago.Client, group, topic string, parts int) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: nil}}
	for p := range parts {
		req.Topics[topic] = append(req.Topics[topic], p)
	}
	resp, err := cl.OffsetFetch(ctx, req)
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	committed := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		committed[p.Partition] = max(p.CommittedOffset, 0)
	}
	var lag int64
	for p := range parts {
		_, last, err := partitionBounds(ctx, cl, topic, p)
		if err != nil {
			t.Fatalf("offsets of %s/%d: %v", topic, p, err)
		}
		lag += last - committed[p]
	}
	return lag
}

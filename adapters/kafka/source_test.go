package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

func TestNewSourceValidates(t *testing.T) {
	t.Parallel()
	ok := []string{"127.0.0.1:9092"}
	tests := []struct {
		name    string
		brokers []string
		topic   string
		group   string
		opts    []SourceOption
	}{
		{"no brokers", nil, "t", "g", nil},
		{"broker without port", []string{"localhost"}, "t", "g", nil},
		{"empty topic", ok, "", "g", nil},
		{"bad topic char", ok, "a/b", "g", nil},
		{"dot topic", ok, "..", "g", nil},
		{"empty group", ok, "t", "", nil},
		{"nil option", ok, "t", "g", []SourceOption{nil}},
		{"nil dialer", ok, "t", "g", []SourceOption{WithDialer(nil)}},
		{"zero commit interval", ok, "t", "g", []SourceOption{WithCommitInterval(0)}},
		{"negative heartbeat", ok, "t", "g", []SourceOption{WithHeartbeatInterval(-time.Second)}},
		{"zero session", ok, "t", "g", []SourceOption{WithSessionTimeout(0)}},
		{"zero rebalance", ok, "t", "g", []SourceOption{WithRebalanceTimeout(0)}},
		{"zero join backoff", ok, "t", "g", []SourceOption{WithJoinBackoff(0)}},
		{"zero max wait", ok, "t", "g", []SourceOption{WithMaxWait(0)}},
		{"zero max bytes", ok, "t", "g", []SourceOption{WithMaxBytes(0)}},
		{"bad start offset", ok, "t", "g", []SourceOption{WithStartOffset(5)}},
		{"nil logger", ok, "t", "g", []SourceOption{WithLogger(nil)}},
		{"zero unknown topic timeout", ok, "t", "g", []SourceOption{WithUnknownTopicTimeout(0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewSource(tt.brokers, tt.topic, tt.group, tt.opts...)
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("err = %v, want ErrInvalidOption", err)
			}
		})
	}
	if _, err := NewSource(ok, "orders.v1", "g", WithStartOffset(kafkago.LastOffset)); err != nil {
		t.Fatal(err)
	}
}

func TestSourceRefusesASecondRun(t *testing.T) {
	t.Parallel()
	c := startCluster(t, kfake.SeedTopics(1, "twice"))
	src, err := NewSource(c.Addrs(), "twice", uniq("g"), fastOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(false)
	stop := consumertest.StartSource(t, src, col)
	defer stop()
	col.waitFor(t, testCtx(t, 20*time.Second), "assignment", func() bool { return col.assigned[0] == 1 })
	if err := src.Run(context.Background(), col); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second Run = %v, want ErrAlreadyRunning", err)
	}
}

// A source delivers every partition in offset order, commits the
// watermarks it is given, and a new source in the same group resumes from
// them.
func TestSourceResumesFromWatermark(t *testing.T) {
	t.Parallel()
	const parts, per = 3, 50
	topic, group := uniq("resume"), uniq("g")
	c := startCluster(t, kfake.SeedTopics(parts, topic))
	produce(t, c.Addrs(), topic, msgs("a", parts, per)...)

	src, err := NewSource(c.Addrs(), topic, group, fastOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(false)
	col.src = src
	// Settle everything except partition 1 from offset 20 on: its
	// watermark stays at 20.
	col.onMsg = func(m *consumer.Message) {
		if m.Partition.ID == 1 && m.Offset >= 20 {
			return
		}
		_ = src.Commit(context.Background(), m.Partition, m.Offset+1)
	}
	stop := consumertest.StartSource(t, src, col)
	ctx := testCtx(t, 30*time.Second)
	col.waitFor(t, ctx, "all messages", func() bool { return len(col.seen) == parts*per })
	for p := int32(0); p < parts; p++ {
		if !slices.IsSorted(col.byPart[p]) {
			t.Fatalf("partition %d delivered out of order: %v", p, col.byPart[p])
		}
	}
	stop()
	got := committed(t, c.Addrs(), group, topic, parts)
	want := map[int]int64{0: per, 1: 20, 2: per}
	for p, w := range want {
		if got[p] != w {
			t.Fatalf("committed = %v, want %v", got, want)
		}
	}

	// The restarted consumer resumes from the watermark: partition 1 from
	// 20, the others only with what is produced now.
	produce(t, c.Addrs(), topic, msgs("b", parts, 5)...)
	src2, err := NewSource(c.Addrs(), topic, group, fastOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	col2 := newCollector(true)
	col2.src = src2
	consumertest.StartSource(t, src2, col2)
	col2.waitFor(t, ctx, "resumed messages", func() bool { return len(col2.seen) == (per-20)+parts*5 })
	if first := col2.byPart[1][0]; first != 20 {
		t.Fatalf("partition 1 resumed at %d, want 20", first)
	}
	for _, p := range []int32{0, 2} {
		if first := col2.byPart[p][0]; first != per {
			t.Fatalf("partition %d resumed at %d, want %d", p, first, per)
		}
	}
}

// Pause stops fetching one partition only; Resume restarts it.
func TestSourcePausesOnePartition(t *testing.T) {
	t.Parallel()
	const per = 40
	topic := uniq("pause")
	c := startCluster(t, kfake.SeedTopics(2, topic))
	produce(t, c.Addrs(), topic, msgs("m", 2, per)...)
	src, err := NewSource(c.Addrs(), topic, uniq("g"), fastOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(true)
	col.src = src
	col.onMsg = func(m *consumer.Message) {
		if m.Partition.ID == 0 && m.Offset == 0 {
			src.Pause(m.Partition)
		}
	}
	consumertest.StartSource(t, src, col)
	ctx := testCtx(t, 30*time.Second)
	// The batch that held the pausing message is delivered whole (all per
	// messages were produced before the first fetch, which returns them in
	// one slice); no fetch of partition 0 follows it. Waiting for the whole
	// batch, not its first message: the collector records a batch message
	// by message, so a count taken mid-batch read 1 of 40 under load.
	col.waitFor(t, ctx, "partition 1 and the pausing batch", func() bool { return len(col.byPart[1]) == per && len(col.byPart[0]) == per })
	col.mu.Lock()
	n0 := len(col.byPart[0])
	col.mu.Unlock()
	// More traffic on partition 1 still flows while 0 stays paused.
	produce(t, c.Addrs(), topic, kafkago.Message{Partition: 1, Value: []byte("late-1")}, kafkago.Message{Partition: 0, Value: []byte("late-0")})
	col.waitFor(t, ctx, "late message on partition 1", func() bool { return col.seen["late-1"] == 1 })
	col.mu.Lock()
	n, late := len(col.byPart[0]), col.seen["late-0"]
	col.mu.Unlock()
	if n != n0 || late != 0 {
		t.Fatalf("paused partition 0 went on: %d messages delivered (%d when paused), late-0 seen %d times", n, n0, late)
	}
	src.Resume(consumer.Partition{Topic: topic, ID: 0})
	col.waitFor(t, ctx, "partition 0 after resume", func() bool { return len(col.byPart[0]) == per+1 })
}

// Two consumers share a group; one leaves mid-run; nothing is lost.
func TestSourceTwoConsumersOneLeaves(t *testing.T) {
	t.Parallel()
	const parts, per = 4, 30
	topic, group := uniq("pair"), uniq("g")
	c := startCluster(t, kfake.SeedTopics(parts, topic))
	produce(t, c.Addrs(), topic, msgs("a", parts, per)...)

	newSrc := func() (*Source, *collector) {
		s, err := NewSource(c.Addrs(), topic, group, fastOpts()...)
		if err != nil {
			t.Fatal(err)
		}
		col := newCollector(true)
		col.src = s
		return s, col
	}
	ctx := testCtx(t, 60*time.Second)
	srcA, colA := newSrc()
	stopA := consumertest.StartSource(t, srcA, colA)
	colA.waitFor(t, ctx, "A to consume the first batch", func() bool { return len(colA.seen) == parts*per })

	srcB, colB := newSrc()
	consumertest.StartSource(t, srcB, colB)
	// The rebalance splits the partitions: A loses some, B gains them.
	colB.waitFor(t, ctx, "B to be assigned", func() bool { return len(colB.assigned) > 0 })
	colA.waitFor(t, ctx, "A to see the revocation", func() bool { return len(colA.revoked) > 0 })
	produce(t, c.Addrs(), topic, msgs("b", parts, per)...)
	stopA() // A leaves mid-run
	produce(t, c.Addrs(), topic, msgs("c", parts, per)...)

	want := append(append(msgs("a", parts, per), msgs("b", parts, per)...), msgs("c", parts, per)...)
	union := func() (missing []string) {
		colA.mu.Lock()
		defer colA.mu.Unlock()
		colB.mu.Lock()
		defer colB.mu.Unlock()
		for _, m := range want {
			v := string(m.Value)
			if colA.seen[v] == 0 && colB.seen[v] == 0 {
				missing = append(missing, v)
			}
		}
		return missing
	}
	for {
		missing := union()
		if len(missing) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("lost %d messages, e.g. %v", len(missing), missing[:min(5, len(missing))])
		case <-colB.changed:
		case <-time.After(50 * time.Millisecond):
		}
	}
	colB.mu.Lock()
	nb := len(colB.assigned)
	colB.mu.Unlock()
	if nb != parts {
		t.Fatalf("after A left, B was assigned %d partitions, want all %d", nb, parts)
	}
}

// A broker restart (same port, same data) ends the generation; the source
// reconnects and goes on from the committed offsets.
func TestSourceSurvivesBrokerRestart(t *testing.T) {
	t.Parallel()
	const parts, per = 2, 20
	topic, group := uniq("restart"), uniq("g")
	c := startCluster(t, kfake.SeedTopics(parts, topic), kfake.DataDir(t.TempDir()))
	produce(t, c.Addrs(), topic, msgs("a", parts, per)...)
	src, err := NewSource(c.Addrs(), topic, group, fastOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(true)
	col.src = src
	consumertest.StartSource(t, src, col)
	ctx := testCtx(t, 60*time.Second)
	col.waitFor(t, ctx, "first batch", func() bool { return len(col.seen) == parts*per })
	// Let a commit land so the restart resumes past the first batch.
	eventually(t, ctx, "first batch committed", func() bool {
		got := committed(t, c.Addrs(), group, topic, parts)
		return got[0] == per && got[1] == per
	})
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	produce(t, c.Addrs(), topic, msgs("b", parts, per)...)
	col.waitFor(t, ctx, "second batch after restart", func() bool {
		for _, m := range msgs("b", parts, per) {
			if col.seen[string(m.Value)] == 0 {
				return false
			}
		}
		return true
	})
	col.mu.Lock()
	defer col.mu.Unlock()
	for _, m := range msgs("a", parts, per) {
		if n := col.seen[string(m.Value)]; n != 1 {
			t.Fatalf("%s delivered %d times; committed messages must not come back", m.Value, n)
		}
	}
}

// What the engine settles after Run returned (it drains after stopping
// the fetch) is still committed, once the group is empty.
func TestSourceCommitsAfterRunReturned(t *testing.T) {
	t.Parallel()
	topic, group := uniq("late"), uniq("g")
	c := startCluster(t, kfake.SeedTopics(1, topic))
	produce(t, c.Addrs(), topic, msgs("a", 1, 10)...)
	src, err := NewSource(c.Addrs(), topic, group, fastOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(false)
	col.src = src
	stop := consumertest.StartSource(t, src, col)
	col.waitFor(t, testCtx(t, 30*time.Second), "all messages", func() bool { return len(col.seen) == 10 })
	stop()
	p := consumer.Partition{Topic: topic, ID: 0}
	if err := src.Commit(testCtx(t, 10*time.Second), p, 6); err != nil {
		t.Fatalf("late commit: %v", err)
	}
	if got := committed(t, c.Addrs(), group, topic, 1)[0]; got != 6 {
		t.Fatalf("committed %d after a late Commit(6)", got)
	}
	// A stale, lower watermark never moves the commit back.
	if err := src.Commit(testCtx(t, 10*time.Second), p, 3); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, c.Addrs(), group, topic, 1)[0]; got != 6 {
		t.Fatalf("committed %d after a stale Commit(3), want 6", got)
	}
}

// Header values reach the handler and the dead letters as they were
// produced: an empty value stays empty (not nil) and a null one stays nil,
// for a tenant header "" (the no-tenant bucket) too.
func TestSourceEmptyHeaderValuesEndToEnd(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	ctx := testCtx(t, 60*time.Second)
	topic := uniq("hdrs")
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	if err := createTopic(ctx, cl, topic, 1, -1); err != nil {
		t.Fatal(err)
	}
	acme := []kafkago.Header{{Key: "tenant", Value: []byte("acme")}, {Key: "empty", Value: []byte{}}, {Key: "null", Value: nil}}
	none := []kafkago.Header{{Key: "tenant", Value: []byte{}}, {Key: "null", Value: nil}}
	for _, hs := range [][]kafkago.Header{acme, none} {
		if _, err := produceOne(ctx, c.Addrs(), topic, kafkago.Message{Key: []byte("k"), Value: []byte("v"), Headers: hs}); err != nil {
			t.Fatal(err)
		}
	}
	src, err := NewSource(c.Addrs(), topic, uniq("g"), fastOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	q, err := NewDLQ(c.Addrs(), topic)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	seen := make(chan []consumer.Header, 2)
	cons, err := consumer.New(consumer.Config{
		Scope:  scope.New(consumertest.FastPolicy(), scope.Options[string]{}),
		Tenant: consumer.FromHeader("tenant"),
		DLQ:    q,
		Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
			seen <- slices.Clone(m.Headers)
			return policy.Permanent(errors.New("refused"))
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(rctx, src) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case hs := <-seen:
		if !sameHeaders(hs, acme) {
			t.Fatalf("the handler got headers %q, want %q (empty and null apart)", hs, acme)
		}
	case <-ctx.Done():
		t.Fatal("the message never reached the handler")
	}
	for tenant, want := range map[string][]kafkago.Header{"acme": acme, "": none} {
		var recs []dlq.Record
		eventually(t, ctx, fmt.Sprintf("the dead letter of %q", tenant), func() bool {
			recs, err = q.Peek(ctx, tenant, 0)
			return err == nil && len(recs) == 1
		})
		if !sameHeaders(recs[0].Headers, want) {
			t.Fatalf("dead letter of %q has headers %q, want %q (empty and null apart)", tenant, recs[0].Headers, want)
		}
	}
}

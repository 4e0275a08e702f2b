package nats

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/internal/natstest"
	"github.com/ringfence/ringfence/scope"
)

// groupFixture is a stream partitioned by tenant (the subject's last
// token) with a static consumer group on it.
type groupFixture struct {
	srv     *natstest.Server
	js      jetstream.JetStream
	stream  string
	subject string // messages go to "<subject>.<tenant>"
	group   string
	ackWait time.Duration
}

func newGroupFixture(t *testing.T, partitions int, members ...string) *groupFixture {
	t.Helper()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	n := nameSeq.Add(1)
	f := &groupFixture{srv: srv, js: js, stream: fmt.Sprintf("GRP%d", n), subject: fmt.Sprintf("grp%d", n), group: "cg", ackWait: 2 * time.Second}
	tr, err := PartitionTransform(f.subject+".*", partitions, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: f.stream, Subjects: []string{f.subject + ".*"}, SubjectTransform: &tr, Storage: jetstream.FileStorage,
	}); err != nil {
		t.Fatal(err)
	}
	if err := CreateConsumerGroup(ctx, js, f.stream, f.group, members...); err != nil {
		t.Fatal(err)
	}
	return f
}

// groupRecorder collects what every engine of a test handled.
type groupRecorder struct {
	mu       sync.Mutex
	order    map[string][]int                      // tenant -> sequence numbers, in handled order
	seen     map[string]int                        // value -> times handled
	again    map[string]map[int]bool               // tenant -> sequence numbers the server delivered more than once
	active   map[consumer.Partition]map[string]int // partition -> engine -> handlers running
	overlaps int
	parts    map[string]map[consumer.Partition]bool // tenant -> partitions it came on
	last     map[string]time.Time                   // engine -> last handled
	first    map[string]time.Time                   // engine -> first handled
}

func newGroupRecorder() *groupRecorder {
	return &groupRecorder{order: map[string][]int{}, seen: map[string]int{}, again: map[string]map[int]bool{},
		active: map[consumer.Partition]map[string]int{}, parts: map[string]map[consumer.Partition]bool{}, last: map[string]time.Time{}, first: map[string]time.Time{}}
}

// enter marks a handler of engine running on p and counts an overlap when
// another engine runs one on p at the same time.
func (r *groupRecorder) enter(engine string, p consumer.Partition) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.active[p]
	if a == nil {
		a = map[string]int{}
		r.active[p] = a
	}
	for e, n := range a {
		if e != engine && n > 0 {
			r.overlaps++
		}
	}
	a[engine]++
}

func (r *groupRecorder) exit(engine string, p consumer.Partition, tenant, value string, ok, redelivered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.active[p][engine]--
	if r.parts[tenant] == nil {
		r.parts[tenant] = map[consumer.Partition]bool{}
	}
	r.parts[tenant][p] = true
	if !ok {
		return
	}
	seq, _ := strconv.Atoi(value[strings.LastIndexByte(value, '-')+1:])
	r.order[tenant] = append(r.order[tenant], seq)
	if redelivered {
		if r.again[tenant] == nil {
			r.again[tenant] = map[int]bool{}
		}
		r.again[tenant][seq] = true
	}
	r.seen[value]++
	now := time.Now()
	if _, ok := r.first[engine]; !ok {
		r.first[engine] = now
	}
	r.last[engine] = now
}

// tally counts distinct values handled, duplicates (handled again) and
// inversions: a value handled for the first time after a later value of
// its tenant, apart from those the server had delivered before
// (redelivered: what a killed instance held unacknowledged comes back after
// AckWait, as JetStream orders it).
func (r *groupRecorder) tally() (distinct, dups, inversions, redelivered int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.seen {
		distinct++
		dups += n - 1
	}
	for tenant, seqs := range r.order {
		done := map[int]bool{}
		top := -1
		for _, s := range seqs {
			if done[s] {
				continue
			}
			done[s] = true
			switch {
			case s >= top:
			case r.again[tenant][s]:
				redelivered++
			default:
				inversions++
			}
			top = max(top, s)
		}
	}
	return distinct, dups, inversions, redelivered
}

// redelivered reports whether the server delivered m more than once.
func redelivered(m *consumer.Message) bool {
	jm, ok := m.Handle.(jetstream.Msg)
	if !ok {
		return false
	}
	md, err := jm.Metadata()
	return err == nil && md.NumDelivered > 1
}

// overlapCount is overlaps, read under the lock: a member's handler may
// still be running (a redelivery) while the test reads it.
func (r *groupRecorder) overlapCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.overlaps
}

// partitionsOf returns the partitions tenant came on, copied under the
// lock: handlers still running add to that set.
func (r *groupRecorder) partitionsOf(tenant string) []consumer.Partition {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ps []consumer.Partition
	for p := range r.parts[tenant] {
		ps = append(ps, p)
	}
	return ps
}

func (r *groupRecorder) distinct() int {
	d, _, _, _ := r.tally()
	return d
}

// member is one engine running as a member instance of the group.
type member struct {
	name   string
	nc     *nats.Conn
	src    *Source
	spill  *SpillLog
	engine *consumer.Consumer
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned, with err set
	err    error
}

type memberOpts struct {
	fail      func(tenant string) bool // the handler fails for these tenants
	maxParked int
}

// startMember opens a Source as member of the group on a connection of its
// own and runs an engine on it.
func (f *groupFixture) startMember(t *testing.T, rec *groupRecorder, instance, memberName string, mo memberOpts) *member {
	t.Helper()
	nc := f.srv.Connect(t)
	src, err := Open(testCtx(t), nc, f.stream, "",
		WithConsumerGroup(f.group, memberName),
		WithGroupConsumerConfig(jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: f.ackWait, MaxDeliver: -1, MaxAckPending: 256}))
	if err != nil {
		t.Fatal(err)
	}
	spill, err := src.SpillLog(testCtx(t), WithSpillTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	q, err := NewDLQ(testCtx(t), src.JetStream(), WithDLQStream(f.stream+"_DLQ"), WithDLQPrefix(f.subject+"dlq"))
	if err != nil {
		t.Fatal(err)
	}
	tenant := FromSubjectToken(-1)
	cfg := consumer.Config{
		DLQ: q,
		Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
			tn, _ := tenant(m)
			rec.enter(instance, m.Partition)
			ok := mo.fail == nil || !mo.fail(tn)
			rec.exit(instance, m.Partition, tn, string(m.Value), ok, redelivered(m))
			if !ok {
				return errors.New("dependency down")
			}
			return nil
		}),
		Tenant:             tenant,
		Spill:              spill,
		Group:              f.group,
		MaxParkedPerTenant: mo.maxParked,
		Scope:              scope.New(consumertest.FastPolicy(), scope.Options[string]{}),
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{name: instance, nc: nc, src: src, spill: spill, engine: c, cancel: cancel, done: make(chan struct{})}
	go func() {
		m.err = c.Run(ctx, src)
		close(m.done)
	}()
	t.Cleanup(func() { m.stop() })
	return m
}

// stop ends the member's engine gracefully and returns Run's error.
func (m *member) stop() error {
	m.cancel()
	select {
	case <-m.done:
		return m.err
	case <-time.After(30 * time.Second):
		return errors.New("engine did not stop")
	}
}

// kill closes the member's connection, as a killed process's would be:
// nothing is acked, nacked or unpinned on its way out.
func (m *member) kill() {
	m.nc.Close()
	select {
	case <-m.done:
	case <-time.After(30 * time.Second):
	}
}

// publishTenants publishes messages from to to (exclusive) round robin
// over tenants, each "<tenant>-<seq>", seq the message's number.
func (f *groupFixture) publishTenants(t *testing.T, tenants, from, to int) {
	t.Helper()
	if err := f.publishRange(tenants, from, to); err != nil {
		t.Fatal(err)
	}
}

// publishRange is publishTenants for goroutines other than the test's.
func (f *groupFixture) publishRange(tenants, from, to int) error {
	for i := from; i < to; i++ {
		tn := fmt.Sprintf("t%02d", i%tenants)
		// Each publish its own bound: a busy machine may take longer
		// than one test context for thousands of them.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := f.js.Publish(ctx, f.subject+"."+tn, fmt.Appendf(nil, "%s-%06d", tn, i))
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// TestGroupMembersKeepTenantOrder runs three engines, each on a connection
// of its own and a member of one static group of 6 partitions: every
// message is handled, each partition by one engine only, and each tenant's
// messages in order.
func TestGroupMembersKeepTenantOrder(t *testing.T) {
	t.Parallel()
	const partitions, tenants, n = 6, 30, 3000
	f := newGroupFixture(t, partitions, "m1", "m2", "m3")
	rec := newGroupRecorder()
	var ms []*member
	for _, name := range []string{"m1", "m2", "m3"} {
		ms = append(ms, f.startMember(t, rec, name, name, memberOpts{}))
	}
	f.publishTenants(t, tenants, 0, n)
	eventually(t, "every message handled", func() bool { return rec.distinct() == n })
	distinct, dups, inv, again := rec.tally()
	if inv != 0 {
		t.Errorf("%d per-tenant order inversions", inv)
	}
	overlaps := rec.overlapCount()
	if overlaps != 0 {
		t.Errorf("%d times two engines ran handlers of one partition at once", overlaps)
	}
	owners := map[consumer.Partition]string{}
	for _, m := range ms {
		if !m.src.Stats().Owning {
			t.Errorf("%s does not own its partitions", m.name)
		}
		for _, p := range m.src.Partitions() {
			// MaxAckPending 256 shared by the member's 2 partitions.
			if c := m.src.MaxUnsettled(p); c != 128 {
				t.Errorf("%s: MaxUnsettled(%v) = %d, want 128", m.name, p, c)
			}
			if o, ok := owners[p]; ok {
				t.Errorf("partition %v owned by %s and %s", p, o, m.name)
			}
			owners[p] = m.name
		}
	}
	if len(owners) != partitions {
		t.Errorf("%d partitions owned, want %d", len(owners), partitions)
	}
	rec.mu.Lock()
	for p, a := range rec.active {
		if len(a) != 1 {
			t.Errorf("partition %v handled by %d engines", p, len(a))
		}
	}
	rec.mu.Unlock()
	t.Logf("group of 3 members: %d messages, %d tenants, %d partitions: %d handled, %d duplicates, %d inversions (%d more by redeliveries), %d overlaps",
		n, tenants, partitions, distinct, dups, inv, again, overlaps)
}

// owner waits until exactly one of ms owns its partitions and returns it.
func owner(t *testing.T, ms ...*member) (own, other *member) {
	t.Helper()
	eventually(t, "one instance pinned", func() bool {
		n := 0
		for _, m := range ms {
			if m.src.Stats().Owning {
				n++
				own = m
			} else {
				other = m
			}
		}
		return n == 1
	})
	return own, other
}

// TestGroupStandbyTakesOver runs two instances of member m1 (one pinned,
// one standby) beside m2: killing the pinned one (its connection closed)
// hands m1's partitions to the standby, which then stops gracefully for a
// third instance. Every message is handled, each tenant in order;
// duplicates are redeliveries of what a stopped instance had not acked.
func TestGroupStandbyTakesOver(t *testing.T) {
	t.Parallel()
	const partitions, tenants, n = 4, 20, 3000
	f := newGroupFixture(t, partitions, "m1", "m2")
	rec := newGroupRecorder()
	f.startMember(t, rec, "m2", "m2", memberOpts{})
	a := f.startMember(t, rec, "m1a", "m1", memberOpts{})
	b := f.startMember(t, rec, "m1b", "m1", memberOpts{})
	f.publishTenants(t, tenants, 0, n/3)
	eventually(t, "first third handled", func() bool { return rec.distinct() == n/3 })
	pinned, standby := owner(t, a, b)
	if st := standby.src.Stats(); st.Pinned != 0 {
		t.Fatalf("standby %s was pinned %d times", standby.name, st.Pinned)
	}

	// Kill the pinned instance while messages flow.
	var pub sync.WaitGroup
	pub.Go(func() {
		if err := f.publishRange(tenants, n/3, 2*n/3); err != nil {
			t.Error(err)
		}
	})
	eventually(t, "some of the second third handled", func() bool { return rec.distinct() > n/3+50 })
	killed := time.Now()
	pinned.kill()
	eventually(t, "standby pinned", func() bool { return standby.src.Stats().Owning })
	killFailover := time.Since(killed)
	pub.Wait()
	eventually(t, "second third handled", func() bool { return rec.distinct() == 2*n/3 })

	// Stop the new owner gracefully with a fresh standby waiting.
	c := f.startMember(t, rec, "m1c", "m1", memberOpts{})
	pub.Go(func() {
		if err := f.publishRange(tenants, 2*n/3, n); err != nil {
			t.Error(err)
		}
	})
	eventually(t, "some of the last third handled", func() bool { return rec.distinct() > 2*n/3+50 })
	stopped := time.Now()
	if err := standby.stop(); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	eventually(t, "third instance pinned", func() bool { return c.src.Stats().Owning })
	stopFailover := time.Since(stopped)
	pub.Wait()
	eventually(t, "every message handled", func() bool { return rec.distinct() == n })

	distinct, dups, inv, again := rec.tally()
	if inv != 0 {
		t.Errorf("%d per-tenant order inversions", inv)
	}
	overlaps := rec.overlapCount()
	if overlaps != 0 {
		t.Errorf("%d times two engines ran handlers of one partition at once", overlaps)
	}
	t.Logf("standby failover: %d messages, %d tenants, %d partitions: %d handled, %d duplicates, %d inversions (%d more by redeliveries), %d overlaps; pinned after kill in %v (AckWait %v, PinnedTTL %v), after graceful stop in %v",
		n, tenants, partitions, distinct, dups, inv, again, overlaps, killFailover.Round(time.Millisecond), f.ackWait, PinnedTTL(f.ackWait), stopFailover.Round(time.Millisecond))
}

// TestGroupSpillLaneFollowsOwner makes one tenant's dependency fail so
// that it spills: only the pinned instance appends to its lane, whose
// subject is its partition's own; after the pinned instance is killed and
// the dependency is back, the standby re-feeds the lane in order.
func TestGroupSpillLaneFollowsOwner(t *testing.T) {
	t.Parallel()
	const partitions, tenants, n = 2, 4, 400
	f := newGroupFixture(t, partitions, "m1")
	rec := newGroupRecorder()
	var down atomic.Bool
	down.Store(true)
	mo := memberOpts{maxParked: 4, fail: func(tn string) bool { return tn == "t00" && down.Load() }}
	a := f.startMember(t, rec, "m1a", "m1", mo)
	b := f.startMember(t, rec, "m1b", "m1", mo)
	f.publishTenants(t, tenants, 0, n)
	pinned, standby := owner(t, a, b)
	eventually(t, "t00 spilled", func() bool { return pinned.engine.Stats().Spilled >= 50 })
	eventually(t, "the other tenants handled", func() bool { return rec.distinct() == n-n/tenants })
	if st := standby.spill.Stats(); st.Appended != 0 {
		t.Fatalf("the standby appended %d spill records", st.Appended)
	}
	// The lane's subject is the one of t00's partition.
	info, err := f.js.Stream(testCtx(t), pinned.spill.Stream())
	if err != nil {
		t.Fatal(err)
	}
	subjects := info.CachedInfo().State.Subjects
	if st, err := info.Info(testCtx(t), jetstream.WithSubjectFilter(">")); err == nil {
		subjects = st.State.Subjects
	}
	parts := rec.partitionsOf("t00")
	if len(parts) != 1 {
		t.Fatalf("t00 came on partitions %v", parts)
	}
	lane := pinned.spill.subject(consumer.SpillLane{Tenant: "t00", Partition: parts[0]})
	if subjects[lane] == 0 {
		t.Fatalf("spill subjects %v, want t00's lane %s", subjects, lane)
	}
	appended := pinned.spill.Stats().Appended

	pinned.kill()
	down.Store(false)
	// A message on t00's partition pins the standby (an idle member is
	// pinned by its next message).
	f.publishTenants(t, tenants, n, n+tenants)
	eventually(t, "every message handled", func() bool { return rec.distinct() == n+tenants })
	eventually(t, "spill stream drained", func() bool {
		st, err := f.js.Stream(testCtx(t), pinned.spill.Stream())
		return err == nil && st.CachedInfo().State.Msgs == 0
	})
	distinct, dups, inv, again := rec.tally()
	if inv != 0 {
		t.Errorf("%d per-tenant order inversions", inv)
	}
	overlaps := rec.overlapCount()
	if overlaps != 0 {
		t.Errorf("%d times two engines ran handlers of one partition at once", overlaps)
	}
	if standby.engine.Stats().Refed == 0 {
		t.Errorf("the new owner re-fed nothing from the spill lane")
	}
	t.Logf("spill failover: %d messages, %d tenants: owner appended %d records to %s, standby re-fed %d; %d handled, %d duplicates, %d inversions (%d more by redeliveries)",
		n+tenants, tenants, appended, lane, standby.engine.Stats().Refed, distinct, dups, inv, again)
}

// TestGroupBadInput: an unknown group, a member not in it, a stream
// without a partition token and a durable given with a group are refused
// with clear errors.
func TestGroupBadInput(t *testing.T) {
	t.Parallel()
	f := newGroupFixture(t, 2, "m1")
	nc := f.srv.Connect(t)
	ctx := testCtx(t)
	plain := newFixture(t, f.srv, time.Second, 16)
	if err := CreateConsumerGroup(ctx, f.js, plain.stream, "cg", "m1"); !errors.Is(err, ErrConsumerGroup) {
		t.Errorf("group on an unpartitioned stream: %v", err)
	}
	for _, tc := range []struct {
		name     string
		stream   string
		durable  string
		opts     []SourceOption
		want     error
		contains string
	}{
		{"unknown group", f.stream, "", []SourceOption{WithConsumerGroup("nope", "m1")}, ErrConsumerGroup, "not found"},
		{"not a member", f.stream, "", []SourceOption{WithConsumerGroup("cg", "m9")}, ErrConsumerGroup, "not a member"},
		{"no partition token", plain.stream, "", []SourceOption{WithConsumerGroup("cg", "m1")}, ErrConsumerGroup, "partition"},
		{"durable and group", f.stream, "work", []SourceOption{WithConsumerGroup("cg", "m1")}, ErrInvalidOption, "durable"},
		{"bad member name", f.stream, "", []SourceOption{WithConsumerGroup("cg", "a.b")}, ErrInvalidOption, "a.b"},
	} {
		_, err := Open(ctx, nc, tc.stream, tc.durable, tc.opts...)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.contains) {
			t.Errorf("%s: %v, want %v containing %q", tc.name, err, tc.want, tc.contains)
		}
	}
	if _, err := NewSource(ctx, f.js, plain.consumer(t), WithConsumerGroup("cg", "m1")); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("NewSource with a group: %v", err)
	}
	for _, tc := range []struct {
		source string
		n      int
		w      []int
	}{{"a.>", 2, []int{1}}, {"a.*", 0, []int{1}}, {"a.*", 2, []int{2}}, {"a.b", 2, nil}} {
		if _, err := PartitionTransform(tc.source, tc.n, tc.w...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("PartitionTransform(%q, %d, %v): %v", tc.source, tc.n, tc.w, err)
		}
	}
}

// TestPinnedDurableStandby binds two Sources in two connections to one
// plain durable made a pinned priority group: only one gets messages at a
// time; when it is killed, the other takes over and every message arrives.
func TestPinnedDurableStandby(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 2*time.Second, 64)
	tenant := FromSubjectToken(-1)
	type inst struct {
		nc   *nats.Conn
		src  *Source
		l    *loop
		done chan error
	}
	start := func() *inst {
		nc := f.srv.Connect(t)
		src, err := Open(testCtx(t), nc, f.stream, f.durable, WithPinnedClient())
		if err != nil {
			t.Fatal(err)
		}
		i := &inst{nc: nc, src: src, l: newLoop(src, tenant, nil), done: make(chan error, 1)}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go func() { i.done <- src.Run(ctx, i.l) }()
		return i
	}
	a, b := start(), start()
	info, err := f.consumer(t).Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.PriorityPolicy != jetstream.PriorityPolicyPinned {
		t.Fatalf("durable priority policy %v, want pinned", info.Config.PriorityPolicy)
	}
	const n = 400
	for i := range n / 2 {
		f.publish(t, fmt.Sprintf("t%d", i%4), fmt.Sprintf("v-%05d", i))
	}
	total := func() int { return a.l.distinct() + b.l.distinct() }
	eventually(t, "first half delivered", func() bool { return total() >= n/2 })
	own, standby := a, b
	if b.src.Stats().Owning {
		own, standby = b, a
	}
	if standby.l.distinct() != 0 || standby.src.Stats().Owning {
		t.Fatalf("the standby got %d messages", standby.l.distinct())
	}
	own.nc.Close()
	<-own.done
	for i := n / 2; i < n; i++ {
		f.publish(t, fmt.Sprintf("t%d", i%4), fmt.Sprintf("v-%05d", i))
	}
	// The standby's count includes what it gets again of the first half:
	// wait for the second half itself.
	eventually(t, "standby delivers the rest", func() bool {
		standby.l.mu.Lock()
		defer standby.l.mu.Unlock()
		for i := n / 2; i < n; i++ {
			if standby.l.seen[fmt.Sprintf("v-%05d", i)] == 0 {
				return false
			}
		}
		return true
	})
	// A message the closed owner received but whose ack it could not send
	// comes again after AckWait, possibly after later ones: a redelivery,
	// the one change of order allowed. The rest keep their order.
	own.l.mu.Lock()
	ownSeen := maps.Clone(own.l.seen)
	own.l.mu.Unlock()
	for tn := range 4 {
		var fresh []string
		for _, v := range standby.l.values(fmt.Sprintf("t%d", tn)) {
			if ownSeen[v] == 0 {
				fresh = append(fresh, v)
			}
		}
		checkInOrder(t, fmt.Sprintf("t%d", tn), fresh)
	}
	all := map[string]bool{}
	for _, l := range []*loop{own.l, standby.l} {
		l.mu.Lock()
		for v := range l.seen {
			all[v] = true
		}
		l.mu.Unlock()
	}
	if len(all) != n {
		t.Fatalf("%d of %d delivered", len(all), n)
	}
}

// TestPartitionTransformRoundTrip: the transform PartitionTransform makes
// is one streamPartitions reads back.
func TestPartitionTransformRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		source string
		n      int
		w      []int
		want   string
	}{
		{"orders.*", 8, []int{1}, "{{partition(8,1)}}.orders.{{wildcard(1)}}"},
		{"a.*.b.*", 3, []int{1, 2}, "{{partition(3,1,2)}}.a.{{wildcard(1)}}.b.{{wildcard(2)}}"},
	} {
		tr, err := PartitionTransform(tc.source, tc.n, tc.w...)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Source != tc.source || tr.Destination != tc.want {
			t.Errorf("PartitionTransform(%q) = %+v, want destination %q", tc.source, tr, tc.want)
		}
		n, err := streamPartitions(jetstream.StreamConfig{Name: "S", SubjectTransform: &tr})
		if err != nil || n != tc.n {
			t.Errorf("streamPartitions(%q) = %d, %v; want %d", tr.Destination, n, err, tc.n)
		}
	}
}

// FuzzGroupDecode feeds a transform destination (from the stream's
// configuration) and a subject (from the server) to their decoders: they
// never panic, a partition count is positive, and a split subject is the
// original without its first token.
func FuzzGroupDecode(f *testing.F) {
	f.Add("{{partition(8,1)}}.orders.{{wildcard(1)}}", "3.orders.acme")
	f.Add("{{ Partition(2, 1) }}.x", "12")
	f.Add("{{partition(", "x.y")
	f.Add("{{partition(99999999999999999999,1)}}", "99999999999999999999.a")
	g := &groupSpec{topic: "S/g"}
	f.Fuzz(func(t *testing.T, dest, subject string) {
		n, err := streamPartitions(jetstream.StreamConfig{Name: "S", SubjectTransform: &jetstream.SubjectTransformConfig{Destination: dest}})
		if err == nil && n < 1 {
			t.Fatalf("streamPartitions(%q) = %d", dest, n)
		}
		if err != nil && !errors.Is(err, ErrConsumerGroup) {
			t.Fatalf("streamPartitions(%q): %v", dest, err)
		}
		p, rest, ok := g.split(subject)
		if !ok {
			return
		}
		tok, after, _ := strings.Cut(subject, ".")
		id, err := strconv.ParseInt(tok, 10, 32)
		if err != nil || p.ID < 0 || int64(p.ID) != id || rest != after || p.Topic != g.topic {
			t.Fatalf("split(%q) = %v, %q", subject, p, rest)
		}
	})
}

// loopMember runs a Source of the group's member on a connection of its
// own with the engine stand-in loop.
type loopMember struct {
	nc   *nats.Conn
	src  *Source
	l    *loop
	done chan error
}

func (f *groupFixture) startLoop(t *testing.T, memberName string) *loopMember {
	t.Helper()
	nc := f.srv.Connect(t)
	src, err := Open(testCtx(t), nc, f.stream, "", WithConsumerGroup(f.group, memberName),
		WithGroupConsumerConfig(jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: f.ackWait, MaxDeliver: -1}))
	if err != nil {
		t.Fatal(err)
	}
	m := &loopMember{nc: nc, src: src, l: newLoop(src, FromSubjectToken(-1), nil), done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { m.done <- src.Run(ctx, m.l) }()
	return m
}

func (m *loopMember) revokedAll() int {
	m.l.mu.Lock()
	defer m.l.mu.Unlock()
	n := 0
	for _, c := range m.l.revoked {
		n += c
	}
	return n
}

// TestGroupPinLossRevokes unpins the owner (pcgroups.StaticMemberStepDown,
// as an operator would): the server's "pin ID mismatch" makes it revoke
// its partitions, and every message still arrives.
func TestGroupPinLossRevokes(t *testing.T) {
	t.Parallel()
	f := newGroupFixture(t, 2, "m1")
	a, b := f.startLoop(t, "m1"), f.startLoop(t, "m1")
	f.publishTenants(t, 4, 0, 100)
	total := func() int {
		seen := map[string]bool{}
		for _, m := range []*loopMember{a, b} {
			m.l.mu.Lock()
			for v := range m.l.seen {
				seen[v] = true
			}
			m.l.mu.Unlock()
		}
		return len(seen)
	}
	eventually(t, "first batch delivered", func() bool { return total() == 100 })
	own := a
	if b.src.Stats().Owning {
		own = b
	}
	if err := pcgroups.StaticMemberStepDown(testCtx(t), f.js, f.stream, f.group, "m1"); err != nil {
		t.Fatal(err)
	}
	pub := 100
	for pub < 400 && own.revokedAll() == 0 { // the server answers a pin mismatch when it has a message
		f.publishTenants(t, 4, pub, pub+20)
		pub += 20
		time.Sleep(100 * time.Millisecond)
	}
	eventually(t, "the unpinned owner revoked", func() bool { return own.revokedAll() == 2 })
	f.publishTenants(t, 4, pub, pub+20)
	pub += 20
	eventually(t, "every message delivered", func() bool { return total() == pub })
	eventually(t, "one owner", func() bool { return a.src.Stats().Owning != b.src.Stats().Owning })
}

// TestGroupConfigChangeEndsRun: a change of the group's configuration
// ends Run with ErrConsumerGroup, after revoking the member's partitions.
func TestGroupConfigChangeEndsRun(t *testing.T) {
	t.Parallel()
	f := newGroupFixture(t, 2, "m1")
	m := f.startLoop(t, "m1")
	f.publishTenants(t, 4, 0, 20)
	eventually(t, "pinned", func() bool { return m.src.Stats().Owning })
	kv, err := f.js.KeyValue(testCtx(t), groupBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(testCtx(t), f.stream+"."+f.group, []byte(`{"max_members":2,"members":["m1","m2"]}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-m.done:
		if !errors.Is(err, ErrConsumerGroup) {
			t.Fatalf("Run: %v, want ErrConsumerGroup", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not end")
	}
	if n := m.revokedAll(); n != 2 || m.src.Stats().Owning {
		t.Fatalf("%d partitions revoked, owning %v", n, m.src.Stats().Owning)
	}
}

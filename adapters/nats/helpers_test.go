package nats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/internal/natstest"
)

var nameSeq atomic.Int64

// fixture is a stream with a durable consumer on an in-process server.
type fixture struct {
	srv     *natstest.Server
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  string
	subject string // prefix; messages go to "<subject>.<tenant-ish>"
	durable string
}

func newFixture(t testing.TB, srv *natstest.Server, ackWait time.Duration, maxAckPending int) *fixture {
	t.Helper()
	if srv == nil {
		srv = natstest.Start(t)
	}
	nc, js := srv.JetStream(t)
	n := nameSeq.Add(1)
	f := &fixture{srv: srv, nc: nc, js: js, stream: fmt.Sprintf("SRC%d", n), subject: fmt.Sprintf("src%d", n), durable: "work"}
	ctx := testCtx(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: f.stream, Subjects: []string{f.subject + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, f.stream, jetstream.ConsumerConfig{
		Durable:       f.durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxAckPending: maxAckPending,
		MaxDeliver:    -1,
	}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) consumer(t testing.TB) jetstream.Consumer {
	t.Helper()
	c, err := f.js.Consumer(testCtx(t), f.stream, f.durable)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fixture) source(t testing.TB, opts ...SourceOption) *Source {
	t.Helper()
	s, err := NewSource(testCtx(t), f.js, f.consumer(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// spillLog opens the fixture's spill log: every call gives a new SpillLog
// over the same stream, as a restarted process would open.
func (f *fixture) spillLog(t testing.TB, opts ...SpillOption) *SpillLog {
	t.Helper()
	s, err := NewSpillLog(testCtx(t), f.js, f.stream, f.durable, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// spillBacklog counts the records in the fixture's spill stream.
func (f *fixture) spillBacklog(t testing.TB) int {
	t.Helper()
	info, err := f.js.Stream(testCtx(t), "RINGFENCE_SPILL_"+f.stream+"_"+f.durable)
	if err != nil {
		t.Fatal(err)
	}
	return int(info.CachedInfo().State.Msgs)
}

// publishRetry publishes one message, retrying while the client reconnects.
func (f *fixture) publishRetry(t testing.TB, subject, value string) {
	t.Helper()
	ctx := testCtx(t)
	t0 := time.Now()
	var err error
	last := ""
	for range 600 {
		// Each try gets a few seconds of its own: a publish sent just
		// before the client noticed the restart is lost, and its wait for
		// a PubAck must not spend the whole test's context.
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = f.js.Publish(actx, subject, []byte(value))
		cancel()
		if err == nil {
			return
		}
		if err.Error() != last {
			last = err.Error()
			t.Logf("publish %s, retrying (%v in): %v", subject, time.Since(t0).Round(time.Millisecond), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("publish %s: %v", subject, err)
}

// publish appends messages to "<subject>.<tenant>" with the value as data,
// waiting for every PubAck.
func (f *fixture) publish(t testing.TB, tenant string, values ...string) {
	t.Helper()
	ctx := testCtx(t)
	for _, v := range values {
		if _, err := f.js.Publish(ctx, f.subject+"."+tenant, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// listBodies names the objects in store. A List runs a watcher that can
// hang when deletes race with it: each try gets 5s, and one that runs out
// is tried again, for at most 30s.
func listBodies(t testing.TB, store jetstream.ObjectStore, bucket string) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		objs, err := store.List(ctx)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrNoObjectsFound):
			return nil
		case err == nil:
			names := make([]string, len(objs))
			for i, o := range objs {
				names[i] = o.Name
			}
			return names
		case !errors.Is(err, context.DeadlineExceeded) || time.Now().After(deadline):
			t.Fatalf("list bucket %s: %v", bucket, err)
		}
	}
}

// eventually polls cond every 5ms for at most 30s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// loop is a minimal engine stand-in: it records deliveries and settles each
// message unless hold says to keep it, in which case it is kept until
// release.
type loop struct {
	src    consumer.Source
	tenant consumer.TenantFunc
	hold   func(tenant string) bool

	mu       sync.Mutex
	order    map[string][]string // tenant -> values in delivery order
	seen     map[string]int
	held     []*consumer.Message
	assigned map[consumer.Partition]int
	revoked  map[consumer.Partition]int
	settled  atomic.Int64
}

func newLoop(src consumer.Source, tenant consumer.TenantFunc, hold func(string) bool) *loop {
	return &loop{src: src, tenant: tenant, hold: hold, order: map[string][]string{}, seen: map[string]int{},
		assigned: map[consumer.Partition]int{}, revoked: map[consumer.Partition]int{}}
}

func (l *loop) Assigned(p consumer.Partition) { l.mu.Lock(); l.assigned[p]++; l.mu.Unlock() }
func (l *loop) Revoked(p consumer.Partition)  { l.mu.Lock(); l.revoked[p]++; l.mu.Unlock() }

func (l *loop) DeliverBatch(ms []*consumer.Message) {
	for _, m := range ms {
		l.Deliver(m)
	}
}

func (l *loop) Deliver(m *consumer.Message) {
	tn, _ := l.tenant(m)
	l.mu.Lock()
	l.order[tn] = append(l.order[tn], string(m.Value))
	l.seen[string(m.Value)]++
	if l.hold != nil && l.hold(tn) {
		l.held = append(l.held, m)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	if err := l.src.Settle(context.Background(), m); err == nil {
		l.settled.Add(1)
	}
}

// release settles every held message (in delivery order) and stops holding.
func (l *loop) release() {
	l.mu.Lock()
	held := l.held
	l.held = nil
	l.hold = nil
	l.mu.Unlock()
	for _, m := range held {
		if err := l.src.Settle(context.Background(), m); err == nil {
			l.settled.Add(1)
		}
	}
}

func (l *loop) count(tenant string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.order[tenant])
}

func (l *loop) heldCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

func (l *loop) distinct() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

func (l *loop) values(tenant string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.order[tenant]...)
}

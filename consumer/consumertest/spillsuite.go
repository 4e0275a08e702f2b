package consumertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// Spiller is implemented by harnesses whose broker offers a spill log; the
// suite then runs its spill cases (see Run).
type Spiller interface {
	// SpillLog returns the harness's spill log for the source the harness
	// feeds. Every call returns a log over the same durable state (a new
	// process would see what an earlier one spilled).
	SpillLog(t testing.TB) consumer.SpillLog
}

// SpillLogHarness gives RunSpillLog a spill log to test.
type SpillLogHarness interface {
	// Open returns a SpillLog over fresh names (on the first call) and,
	// on later calls, a new instance over the same durable state: what a
	// restarted process would open.
	Open(t testing.TB) consumer.SpillLog
	// Partition is a source partition the log's lanes may name; Other is
	// a second one.
	Partition() consumer.Partition
	Other() consumer.Partition
}

// RunSpillLog is the conformance suite of a consumer.SpillLog
// implementation: order and byte-for-byte content of appended messages,
// reads from a position, lanes kept apart (hostile tenant keys included),
// commits that remove entries, Pending per partition, and durability
// across a new instance.
func RunSpillLog(t *testing.T, newHarness func(t testing.TB) SpillLogHarness) {
	t.Run("AppendReadInOrder", func(t *testing.T) { spillAppendRead(t, newHarness(t)) })
	t.Run("ReadFromPosition", func(t *testing.T) { spillReadFrom(t, newHarness(t)) })
	t.Run("LanesApart", func(t *testing.T) { spillLanesApart(t, newHarness(t)) })
	t.Run("CommitAndPending", func(t *testing.T) { spillCommitPending(t, newHarness(t)) })
	t.Run("DurableAcrossInstances", func(t *testing.T) { spillDurable(t, newHarness(t)) })
}

func spillMsg(p consumer.Partition, off int64, value string, headers ...dlq.Header) *consumer.Message {
	return &consumer.Message{
		Key: []byte("k-" + value), Value: []byte(value), Headers: headers, Topic: p.Topic,
		Partition: p, Offset: off, Time: time.Unix(1700000000, off*1000).UTC(),
	}
}

func readAll(t testing.TB, log consumer.SpillLog, lane consumer.SpillLane, from int64) []*consumer.Message {
	t.Helper()
	ctx := context.Background()
	var out []*consumer.Message
	for i := 0; i < 100; i++ {
		ms, err := log.Read(ctx, lane, from, 7)
		if err != nil {
			t.Fatalf("Read(%v, %d): %v", lane, from, err)
		}
		if len(ms) == 0 {
			return out
		}
		for _, m := range ms {
			if m.SpillPos < from && from >= 0 {
				t.Fatalf("Read from %d returned position %d", from, m.SpillPos)
			}
			from = m.SpillPos + 1
		}
		out = append(out, ms...)
	}
	t.Fatalf("Read never reached the end of %v", lane)
	return nil
}

func spillAppendRead(t *testing.T, h SpillLogHarness) {
	log, p := h.Open(t), h.Partition()
	lane := consumer.SpillLane{Tenant: "acme", Partition: p}
	hs := []dlq.Header{{Key: "b", Value: []byte("2")}, {Key: "a", Value: []byte("1")}, {Key: "a", Value: []byte("dup")}, {Key: "empty", Value: []byte{}},
		// A producer's trace context, and the engine's for a traced
		// message's process span: a re-fed copy's span links to both.
		{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
		{Key: consumer.HeaderTraceParent, Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}}
	var want []*consumer.Message
	for i := range 3 {
		var batch []*consumer.Message
		for j := range 4 {
			off := int64(10*i + j)
			m := spillMsg(p, off, fmt.Sprintf("v%02d", off), hs...)
			if off == 0 {
				m.Value = []byte{0, 0xff, '\n', 'x'} // not UTF-8
			}
			if j == 1 {
				// An engine's note, carried byte for byte (the engine
				// writes printable ASCII; a log carries any bytes).
				m.SetSpillNote([]byte(fmt.Sprintf("note-%d \x00\xff", off)))
			}
			batch = append(batch, m)
		}
		if err := log.Append(context.Background(), lane, batch); err != nil {
			t.Fatalf("Append: %v", err)
		}
		want = append(want, batch...)
	}
	got := readAll(t, log, lane, -1)
	if len(got) != len(want) {
		t.Fatalf("read %d entries, appended %d", len(got), len(want))
	}
	for i, g := range got {
		w := want[i]
		if !g.Refed {
			t.Fatalf("entry %d: Refed not set", i)
		}
		if i > 0 && g.SpillPos <= got[i-1].SpillPos {
			t.Fatalf("positions not increasing: %d after %d", g.SpillPos, got[i-1].SpillPos)
		}
		if !bytes.Equal(g.Key, w.Key) || !bytes.Equal(g.Value, w.Value) || g.Partition != w.Partition || g.Offset != w.Offset {
			t.Fatalf("entry %d = key %q value %q %v@%d, want key %q value %q %v@%d", i, g.Key, g.Value, g.Partition, g.Offset, w.Key, w.Value, w.Partition, w.Offset)
		}
		if !g.Time.Equal(w.Time) {
			t.Fatalf("entry %d time %v, want %v", i, g.Time, w.Time)
		}
		if !bytes.Equal(g.SpillNote(), w.SpillNote()) {
			t.Fatalf("entry %d spill note %q, want %q", i, g.SpillNote(), w.SpillNote())
		}
		if !slices.EqualFunc(g.Headers, w.Headers, func(a, b dlq.Header) bool { return a.Key == b.Key && bytes.Equal(a.Value, b.Value) }) {
			t.Fatalf("entry %d headers %v, want %v", i, g.Headers, w.Headers)
		}
	}
}

func spillReadFrom(t *testing.T, h SpillLogHarness) {
	log, p := h.Open(t), h.Partition()
	lane := consumer.SpillLane{Tenant: "globex", Partition: p}
	var batch []*consumer.Message
	for i := range 10 {
		batch = append(batch, spillMsg(p, int64(i), fmt.Sprint(i)))
	}
	if err := log.Append(context.Background(), lane, batch); err != nil {
		t.Fatal(err)
	}
	all := readAll(t, log, lane, -1)
	if len(all) != 10 {
		t.Fatalf("read %d, want 10", len(all))
	}
	from := all[6].SpillPos
	rest := readAll(t, log, lane, from)
	if len(rest) != 4 || string(rest[0].Value) != "6" {
		t.Fatalf("Read from the 7th position returned %d entries starting %q", len(rest), rest[0].Value)
	}
	if past := readAll(t, log, lane, all[9].SpillPos+1); len(past) != 0 {
		t.Fatalf("Read past the end returned %d entries", len(past))
	}
}

func spillLanesApart(t *testing.T, h SpillLogHarness) {
	log, p, q := h.Open(t), h.Partition(), h.Other()
	// Keys crafted to look like each other's tokens, wildcards and paths.
	tenants := []string{"acme", "acme.*", "acme_2e_2a", "*", ">", "../etc", "a b", "\xff\xfe", "ACME", string(bytes.Repeat([]byte("long"), 200))}
	ctx := context.Background()
	for i, tn := range tenants {
		for _, part := range []consumer.Partition{p, q} {
			lane := consumer.SpillLane{Tenant: tn, Partition: part}
			if err := log.Append(ctx, lane, []*consumer.Message{spillMsg(part, int64(i), fmt.Sprintf("%d@%d", i, part.ID))}); err != nil {
				t.Fatalf("Append for %q: %v", tn, err)
			}
		}
	}
	for i, tn := range tenants {
		for _, part := range []consumer.Partition{p, q} {
			got := readAll(t, log, consumer.SpillLane{Tenant: tn, Partition: part}, -1)
			if len(got) != 1 || string(got[0].Value) != fmt.Sprintf("%d@%d", i, part.ID) {
				var vs []string
				for _, m := range got {
					vs = append(vs, string(m.Value))
				}
				t.Fatalf("lane %q/%v reads %q, want only its own entry", tn, part, vs)
			}
		}
	}
}

func spillCommitPending(t *testing.T, h SpillLogHarness) {
	log, p, q := h.Open(t), h.Partition(), h.Other()
	ctx := context.Background()
	a := consumer.SpillLane{Tenant: "a", Partition: p}
	b := consumer.SpillLane{Tenant: "b", Partition: p}
	c := consumer.SpillLane{Tenant: "c", Partition: q}
	for _, lane := range []consumer.SpillLane{a, b, c} {
		var batch []*consumer.Message
		for i := range 5 {
			batch = append(batch, spillMsg(lane.Partition, int64(i), lane.Tenant+fmt.Sprint(i)))
		}
		if err := log.Append(ctx, lane, batch); err != nil {
			t.Fatal(err)
		}
	}
	pending := func(part consumer.Partition) []string {
		t.Helper()
		var out []string
		var ls []consumer.SpillLane
		var err error
		// An index behind the log may take a moment: retried, up to
		// WaitTimeout.
		for deadline := time.Now().Add(WaitTimeout); ; time.Sleep(20 * time.Millisecond) {
			if ls, err = log.Pending(ctx, part); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("Pending(%v): %v", part, err)
		}
		for _, l := range ls {
			if l.Partition != part {
				t.Fatalf("Pending(%v) returned a lane of %v", part, l.Partition)
			}
			out = append(out, l.Tenant)
		}
		slices.Sort(out)
		return out
	}
	if got := pending(p); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("Pending(p) = %q, want a and b", got)
	}
	if got := pending(q); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("Pending(q) = %q, want c", got)
	}
	all := readAll(t, log, a, -1)
	if err := log.Commit(ctx, a, all[3].SpillPos); err != nil {
		t.Fatal(err)
	}
	if rest := readAll(t, log, a, -1); len(rest) != 2 || string(rest[0].Value) != "a3" {
		t.Fatalf("after a commit below the 4th entry, reading from the cursor gives %d entries", len(rest))
	}
	if err := log.Commit(ctx, a, all[4].SpillPos+1); err != nil {
		t.Fatal(err)
	}
	if rest := readAll(t, log, a, -1); len(rest) != 0 {
		t.Fatalf("a fully committed lane still reads %d entries", len(rest))
	}
	if got := pending(p); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Pending(p) after a's commit = %q, want b", got)
	}
}

func spillDurable(t *testing.T, h SpillLogHarness) {
	log, p := h.Open(t), h.Partition()
	ctx := context.Background()
	lane := consumer.SpillLane{Tenant: "durable", Partition: p}
	var batch []*consumer.Message
	for i := range 6 {
		batch = append(batch, spillMsg(p, int64(i), fmt.Sprint(i)))
	}
	if err := log.Append(ctx, lane, batch); err != nil {
		t.Fatal(err)
	}
	all := readAll(t, log, lane, -1)
	if err := log.Commit(ctx, lane, all[2].SpillPos); err != nil {
		t.Fatal(err)
	}
	again := h.Open(t)
	ls, err := again.Pending(ctx, p)
	if err != nil || len(ls) != 1 || ls[0] != lane {
		t.Fatalf("a new instance's Pending = %v, %v; want the lane", ls, err)
	}
	rest := readAll(t, again, lane, -1)
	if len(rest) != 4 || string(rest[0].Value) != "2" {
		t.Fatalf("a new instance reads %d entries from the cursor, want 4 starting at 2", len(rest))
	}
}

func newScope(p policy.Policy) *scope.Scope[string] {
	return scope.New(p, scope.Options[string]{})
}

// spillConfig is the engine configuration of the spill cases: small bounds
// so that a tenant spills quickly.
func spillConfig(h Harness, cfg consumer.Config) consumer.Config {
	if cfg.MaxParkedPerTenant == 0 {
		cfg.MaxParkedPerTenant = 10
	}
	if cfg.RefeedWindow == 0 {
		cfg.RefeedWindow = 8
	}
	cfg.Concurrency = 8
	return cfg
}

// testSpill: a tenant that stays down past its parked bound spills; its
// partition-mates are handled and the partition's commit moves past the
// spilled messages; after recovery the tenant is handled in order from its
// spill log, nothing dead-lettered, and its log drained.
func testSpill(t *testing.T, h Harness) {
	sp, ok := h.(Spiller)
	if !ok {
		t.Skip("harness has no spill log")
	}
	const noisy, calm = 120, 40
	var msgs []Msg
	for i := range noisy {
		msgs = append(msgs, Msg{Tenant: "noisy", Partition: 0, Value: []byte(id("noisy", 0, i))})
		if i < calm {
			msgs = append(msgs, Msg{Tenant: "calm", Partition: 0, Value: []byte(id("calm", 0, i))})
		}
	}
	h.Produce(t, msgs...)
	var down atomic.Bool
	down.Store(true)
	rec := NewRecorder()
	var spilling, drained, paused atomic.Int64
	r := start(t, h, h.NewSource(t), spillConfig(h, consumer.Config{
		Spill: sp.SpillLog(t),
		Handler: recordHandler(rec, h.Tenant(), func(tn, v string) error {
			if tn == "noisy" && down.Load() {
				return errDown
			}
			return nil
		}),
		OnEvent: func(e consumer.Event) {
			switch {
			case e.Kind == consumer.EventSpilling && e.Tenant == "noisy":
				spilling.Add(1)
			case e.Kind == consumer.EventSpillDrained && e.Tenant == "noisy":
				drained.Add(1)
			case e.Kind == consumer.EventPaused:
				paused.Add(1)
			}
		},
	}))
	Eventually(t, "calm handled while noisy is down", func() bool { return rec.Count("calm") == calm })
	Eventually(t, "noisy spilled", func() bool { return spilling.Load() > 0 })
	Eventually(t, "the partition's commit past most of noisy's messages", func() bool {
		s := r.c.Stats()
		return len(s.Partitions) > 0 && s.Partitions[0].Unsettled <= 20
	})
	if n := paused.Load(); n != 0 {
		t.Fatalf("the partition was paused %d times: a spilling tenant must not stop its partition-mates", n)
	}
	down.Store(false)
	Eventually(t, "noisy handled after recovery", func() bool { return rec.Count("noisy") >= noisy && rec.Distinct() == noisy+calm })
	checkOrder(t, "noisy", rec.Order("noisy"))
	Eventually(t, "noisy's spill log drained", func() bool { return drained.Load() > 0 })
	if dl := h.DeadLetters(t, "noisy"); len(dl) != 0 {
		t.Fatalf("a transient outage dead-lettered %d messages", len(dl))
	}
	s := r.c.Stats()
	if s.Spilled == 0 || s.Refed < s.Spilled-s.Duplicates {
		t.Fatalf("stats spilled %d refed %d duplicates %d", s.Spilled, s.Refed, s.Duplicates)
	}
	r.stop(t)
}

// testSpillRestart: the engine stops while a tenant is spilled; a new
// engine on a new source and the same log finds the spilled messages
// (Pending), keeps the tenant's order and handles everything once the
// dependency is back.
func testSpillRestart(t *testing.T, h Harness) {
	sp, ok := h.(Spiller)
	if !ok {
		t.Skip("harness has no spill log")
	}
	const noisy = 80
	var msgs []Msg
	for i := range noisy {
		msgs = append(msgs, Msg{Tenant: "noisy", Partition: 0, Value: []byte(id("noisy", 0, i))})
	}
	h.Produce(t, msgs...)
	var down atomic.Bool
	down.Store(true)
	rec := NewRecorder()
	fail := func(tn, v string) error {
		if tn == "noisy" && down.Load() {
			return errDown
		}
		return nil
	}
	r1 := start(t, h, h.NewSource(t), spillConfig(h, consumer.Config{Spill: sp.SpillLog(t), Handler: recordHandler(rec, h.Tenant(), fail)}))
	Eventually(t, "noisy spilled before the restart", func() bool { return r1.c.Stats().Spilled >= noisy/2 })
	r1.stop(t)
	more := []Msg{}
	for i := noisy; i < noisy+20; i++ {
		more = append(more, Msg{Tenant: "noisy", Partition: 0, Value: []byte(id("noisy", 0, i))})
	}
	h.Produce(t, more...)
	down.Store(false)
	r2 := start(t, h, h.NewSource(t), spillConfig(h, consumer.Config{Spill: sp.SpillLog(t), Handler: recordHandler(rec, h.Tenant(), fail)}))
	Eventually(t, "everything handled after the restart", func() bool { return rec.Distinct() == noisy+20 })
	checkOrder(t, "noisy", rec.Order("noisy"))
	if dl := h.DeadLetters(t, "noisy"); len(dl) != 0 {
		t.Fatalf("dead-lettered %d across a restart", len(dl))
	}
	r2.stop(t)
}

// testStuckHead: a lone message that keeps failing (no evidence against it)
// holds its partition's commit only for StuckAfter: its tenant spills and
// the partition-mates behind it are committed; once it succeeds it is
// handled from the spill log.
func testStuckHead(t *testing.T, h Harness) {
	sp, ok := h.(Spiller)
	if !ok {
		t.Skip("harness has no spill log")
	}
	h.Produce(t, Msg{Tenant: "stuck", Partition: 0, Value: []byte(id("stuck", 0, 0))})
	var msgs []Msg
	for i := range 30 {
		msgs = append(msgs, Msg{Tenant: "mate", Partition: 0, Value: []byte(id("mate", 0, i))})
	}
	h.Produce(t, msgs...)
	var down atomic.Bool
	down.Store(true)
	rec := NewRecorder()
	pol := policy.Policy{Retry: policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Kind: policy.Constant, Base: 5 * time.Millisecond}}}
	r := start(t, h, h.NewSource(t), spillConfig(h, consumer.Config{
		Spill:      sp.SpillLog(t),
		StuckAfter: 300 * time.Millisecond,
		Scope:      newScope(pol),
		Handler: recordHandler(rec, h.Tenant(), func(tn, v string) error {
			if tn == "stuck" && down.Load() {
				return errDown
			}
			return nil
		}),
	}))
	Eventually(t, "mates handled", func() bool { return rec.Count("mate") == 30 })
	Eventually(t, "the partition committed past the stuck message", func() bool {
		s := r.c.Stats()
		return len(s.Partitions) > 0 && s.Partitions[0].Unsettled == 0 && s.Spilled >= 1
	})
	down.Store(false)
	Eventually(t, "the stuck message handled from the spill log", func() bool { return rec.Count("stuck") >= 1 })
	if dl := h.DeadLetters(t, "stuck"); len(dl) != 0 {
		t.Fatalf("the lone message was dead-lettered without evidence")
	}
	r.stop(t)
}

// testSpilledVerdict: a poison message judged while the DLQ refuses its
// dead letter, then spilled (its tenant quarantined), is dead-lettered by
// the next process, for the reason first judged and without another call:
// the verdict travels in its spill record, and nothing behind it is left
// to convict it anew.
func testSpilledVerdict(t *testing.T, h Harness) {
	sp, ok := h.(Spiller)
	if !ok {
		t.Skip("harness has no spill log")
	}
	const poison = "acme/poison"
	h.Produce(t, Msg{Tenant: "acme", Partition: 0, Value: []byte(poison)},
		Msg{Tenant: "acme", Partition: 0, Value: []byte(id("acme", 0, 1))},
		Msg{Tenant: "acme", Partition: 0, Value: []byte(id("acme", 0, 2))})
	sink := &switchSink{Sink: h.Sink(t)}
	sink.down.Store(true)
	rec := NewRecorder()
	var poisonCalls atomic.Int32
	var refused atomic.Value // the reason of the refused dead letter
	cfg := consumer.Config{
		DLQ:      sink,
		DLQProbe: 5 * time.Millisecond,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == poison {
				poisonCalls.Add(1)
				return errPoison
			}
			tn, err := h.Tenant()(m)
			if err != nil {
				return err
			}
			rec.Add(tn, string(m.Value))
			return nil
		}),
		OnEvent: func(ev consumer.Event) {
			if ev.Kind == consumer.EventDLQFailed && ev.Tenant == "acme" {
				refused.Store(ev.Reason)
			}
		},
	}
	cfg.Spill = sp.SpillLog(t)
	r1 := start(t, h, h.NewSource(t), spillConfig(h, cfg))
	Eventually(t, "the poison message judged, its dead letter refused", func() bool {
		return rec.Count("acme") == 2 && refused.Load() != nil
	})
	r1.c.SetControls(map[string]consumer.Control{"acme": {Quarantine: true}})
	Eventually(t, "the poison message spilled", func() bool { return r1.c.Stats().Spilled >= 1 })
	r1.stop(t)
	calls := poisonCalls.Load()

	sink.down.Store(false)
	cfg.Spill = sp.SpillLog(t) // the next process's
	r2 := start(t, h, h.NewSource(t), spillConfig(h, cfg))
	Eventually(t, "the poison message dead-lettered by the next process", func() bool { return len(h.DeadLetters(t, "acme")) == 1 })
	if n := poisonCalls.Load() - calls; n != 0 {
		t.Fatalf("the re-fed poison message was called %d times: its verdict did not travel in its spill record", n)
	}
	dl := h.DeadLetters(t, "acme")[0]
	if want := refused.Load().(dlq.Reason); string(dl.Value) != poison || dl.Reason != want {
		t.Fatalf("dead letter %q for %q, want %q for %q, the reason it was refused for", dl.Value, dl.Reason, poison, want)
	}
	r2.stop(t)
}

// errPoison is the error of a message that can never be handled.
var errPoison = errors.New("consumertest: message cannot be processed")

// switchSink is a DLQ that refuses every write while down is set.
type switchSink struct {
	dlq.Sink
	down atomic.Bool
}

func (s *switchSink) Write(ctx context.Context, r *dlq.Record) error {
	if s.down.Load() {
		return ErrSinkDown
	}
	return s.Sink.Write(ctx, r)
}

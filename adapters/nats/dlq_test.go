package nats

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/natstest"
)

func newDLQ(t testing.TB, js jetstream.JetStream) *DLQ {
	t.Helper()
	q, err := NewDLQ(testCtx(t), js, WithDLQStream("DEAD"), WithDLQPrefix("dead.letters"))
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// recordSeq gives every test record a source sequence of its own, so that
// records are distinct dead letters (copies share their ID).
var recordSeq atomic.Uint64

func record(tenant, source, value string) *dlq.Record {
	now := time.Now().UTC()
	return &dlq.Record{
		Tenant: tenant, Value: []byte(value), Source: source, Offset: -1, Stream: "SRC", Sequence: recordSeq.Add(1),
		Group: "work", Attempts: 3, FirstFailure: now, LastFailure: now, Error: "boom", ErrorType: "*errors.errorString",
		Reason:  dlq.ReasonExhausted,
		Headers: []dlq.Header{{Key: "trace", Value: []byte("t-1")}},
	}
}

// dlqHarness runs consumertest.RunInspector on a server of its own, with
// the source stream SRC ("src.>").
type dlqHarness struct {
	srv *natstest.Server
	js  jetstream.JetStream
	src jetstream.Stream
	seq atomic.Uint64
}

func newDLQHarness(t testing.TB) *dlqHarness {
	t.Helper()
	h := &dlqHarness{srv: natstest.Start(t)}
	_, h.js = h.srv.JetStream(t)
	var err error
	if h.src, err = h.js.CreateStream(testCtx(t), jetstream.StreamConfig{Name: "SRC", Subjects: []string{"src.>"}}); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *dlqHarness) Open(t testing.TB) (dlq.Sink, dlq.Inspector) {
	q := newDLQ(t, h.js)
	return q, q
}

func (h *dlqHarness) Record(tenant, value string) *dlq.Record {
	return &dlq.Record{
		Tenant: tenant, Value: []byte(value), Source: dlq.NATSSubject("src", tenant),
		Offset: -1, Stream: "SRC", Sequence: h.seq.Add(1), Reason: dlq.ReasonPermanent,
	}
}

func (h *dlqHarness) Replayed(t testing.TB) []consumertest.Replayed {
	t.Helper()
	info, err := h.src.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []consumertest.Replayed
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := h.src.GetMsg(testCtx(t), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, consumertest.Replayed{Value: m.Data, Headers: fromNATSHeader(m.Header)})
	}
	return out
}

// OpenLive opens a DLQ on the stream LIVE ("live.>"), which holds live
// data: acme's would be "live.acme".
func (h *dlqHarness) OpenLive(t testing.TB) (dlq.Inspector, func(testing.TB), error) {
	t.Helper()
	ctx := testCtx(t)
	live := sourceStream(t, h.js, "LIVE", "live")
	for i := range 3 {
		if _, err := h.js.Publish(ctx, "live.acme", fmt.Appendf(nil, "live-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	intact := func(t testing.TB) {
		t.Helper()
		if info, err := live.Info(testCtx(t)); err != nil || info.State.Msgs != 3 {
			t.Fatalf("the live stream holds %d messages, want 3 (%v)", info.State.Msgs, err)
		}
	}
	q, err := NewDLQ(ctx, h.js, WithDLQStream("LIVE"), WithDLQPrefix("live"))
	if err != nil {
		return nil, intact, err
	}
	return q, intact, nil
}

func TestDLQConformance(t *testing.T) {
	t.Parallel()
	consumertest.RunInspector(t, func(t testing.TB) consumertest.InspectorHarness { return newDLQHarness(t) })
}

// Crafted tenant keys each get one subject under the prefix, made of one
// plain token: no '.', wildcard or whitespace reaches a subject.
func TestTenantSubjectsArePlainTokens(t *testing.T) {
	t.Parallel()
	h := newDLQHarness(t)
	q := newDLQ(t, h.js)
	ctx := testCtx(t)
	tenants := []string{"acme", "acme.*", "acme.>", "*", ">", "a b", "evil.>.x", " ", "a\tb", strings.Repeat("x.", 200), ""}
	for _, tn := range tenants {
		if err := q.Write(ctx, h.Record(tn, "v")); err != nil {
			t.Fatalf("write %q: %v", tn, err)
		}
	}
	info, err := q.stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != len(tenants) {
		t.Fatalf("%d subjects for %d tenants: %v", len(info.State.Subjects), len(tenants), info.State.Subjects)
	}
	for subj, n := range info.State.Subjects {
		tok, ok := dlq.SplitNATSSubject("dead.letters", subj)
		if !ok || n != 1 || strings.ContainsAny(tok, ".*> \t") {
			t.Fatalf("subject %q (count %d) is not one plain token under the prefix", subj, n)
		}
	}
}

func TestRecordRoundTripKeepsHeaders(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	q := newDLQ(t, js)
	ctx := testCtx(t)
	r := record("acme", "src.acme", "payload")
	r.Headers = append(r.Headers, dlq.Header{Key: "Nats-Msg-Id", Value: []byte("id-1")}, dlq.Header{Key: "Nats-Expected-Last-Sequence", Value: []byte("999")})
	// Two messages with the same original Nats-Msg-Id: acted on by the DLQ
	// stream, it would drop the second as a duplicate; a Nats-Expected-*
	// header would fail the write.
	for range 2 {
		r.Sequence = recordSeq.Add(1)
		if err := q.Write(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := q.Peek(ctx, "acme", 0)
	if err != nil || len(recs) != 2 {
		t.Fatalf("peek: %d records, %v", len(recs), err)
	}
	g := recs[0]
	if g.Tenant != "acme" || g.Source != "src.acme" || g.Stream != "SRC" || g.Sequence == 0 || g.Group != "work" ||
		g.Attempts != 3 || g.Error != "boom" || g.Reason != dlq.ReasonExhausted || g.Position == 0 || g.Time.IsZero() ||
		!g.LastFailure.Equal(r.LastFailure) {
		t.Fatalf("record came back as %+v", g)
	}
	hv := map[string]string{}
	for _, h := range g.Headers {
		hv[h.Key] = string(h.Value)
	}
	if hv["trace"] != "t-1" || hv["Nats-Msg-Id"] != "id-1" || hv["Nats-Expected-Last-Sequence"] != "999" {
		t.Fatalf("headers came back as %v", hv)
	}
}

// A replayed message leaves out the original's Nats-Msg-Id: published
// again within the source stream's duplicate window, it would be dropped
// as a duplicate of the original.
func TestReplayDropsTheOriginalsMsgID(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	q := newDLQ(t, f.js)
	ctx := testCtx(t)
	if _, err := f.js.PublishMsg(ctx, &nats.Msg{Subject: f.subject + ".acme", Data: []byte("m0"), Header: nats.Header{"Nats-Msg-Id": {"id-0"}}}); err != nil {
		t.Fatal(err)
	}
	r := record("acme", f.subject+".acme", "m0")
	r.Headers = append(r.Headers, dlq.Header{Key: "Nats-Msg-Id", Value: []byte("id-0")})
	if err := q.Write(ctx, r); err != nil {
		t.Fatal(err)
	}
	if moved, err := q.Replay(ctx, "acme", dlq.ReplayOptions{}); err != nil || len(moved) != 1 {
		t.Fatalf("replay = %d, %v", len(moved), err)
	}
	src, err := f.js.Stream(ctx, f.stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := src.GetMsg(ctx, 2)
	if err != nil {
		t.Fatalf("the replayed message is not in the source: %v", err)
	}
	if string(m.Data) != "m0" || m.Header.Get("trace") != "t-1" || m.Header.Get("Nats-Msg-Id") != "" {
		t.Fatalf("replayed %q with headers %v; want m0, its trace header and no Nats-Msg-Id", m.Data, m.Header)
	}
}

func TestReplayRefusesRecordWithoutSource(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	q := newDLQ(t, js)
	ctx := testCtx(t)
	if err := q.Write(ctx, record("acme", "", "x")); err != nil {
		t.Fatal(err)
	}
	moved, err := q.Replay(ctx, "acme", dlq.ReplayOptions{})
	if !errors.Is(err, ErrNoSource) || !errors.Is(err, ErrNotReplayable) || len(moved) != 0 {
		t.Fatalf("replay = %d, %v; want ErrNoSource (an ErrNotReplayable)", len(moved), err)
	}
	if recs, _ := q.Peek(ctx, "acme", 0); len(recs) != 1 {
		t.Fatal("record removed although not replayed")
	}
}

// A dead letter with a header name NATS cannot carry (it came from Kafka,
// or was written directly) is kept byte for byte, but replaying it to NATS
// is refused with a clear error: published, it would be a message no NATS
// client can decode. It stays in the DLQ and can be purged.
func TestReplayRefusesHeadersNATSCannotCarry(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx := testCtx(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SRC", Subjects: []string{"src.>"}}); err != nil {
		t.Fatal(err)
	}
	q := newDLQ(t, js)
	r := record("acme", "src.acme", "v")
	r.Headers = []dlq.Header{{Key: "trace-<id>", Value: []byte("1")}}
	if err := q.Write(ctx, r); err != nil {
		t.Fatal(err)
	}
	recs, err := q.Peek(ctx, "acme", 0)
	if err != nil || len(recs) != 1 || recs[0].Headers[0].Key != "trace-<id>" {
		t.Fatalf("peek %v, %v: want the header kept", recs, err)
	}
	moved, err := q.Replay(ctx, "acme", dlq.ReplayOptions{})
	if !errors.Is(err, ErrNotReplayable) || len(moved) != 0 || !strings.Contains(err.Error(), "trace-<id>") {
		t.Fatalf("replay = %d moved, %v; want ErrNoSource naming the header", len(moved), err)
	}
	if recs, _ := q.Peek(ctx, "acme", 0); len(recs) != 1 {
		t.Fatalf("the refused dead letter left the DLQ")
	}
	if info, _ := js.Stream(ctx, "SRC"); info.CachedInfo().State.Msgs != 0 {
		t.Fatalf("something reached the source stream")
	}
	if n, err := q.Purge(ctx, "acme"); err != nil || n != 1 {
		t.Fatalf("purge = %d, %v", n, err)
	}
}

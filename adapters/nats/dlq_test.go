package nats

import (
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// TestHostileTenantKeysStayInTheirOwnSubject writes one record per tenant,
// including keys with '.', '*', '>', spaces and an over-long key, and checks
// that each lands in exactly one subject, its own, and reads back as its own.
func TestHostileTenantKeysStayInTheirOwnSubject(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	q := newDLQ(t, js)
	ctx := testCtx(t)
	long := strings.Repeat("x.", 200)
	tenants := []string{"acme", "acme.*", "acme.>", "*", ">", "a b", "evil.>.x", " ", "acme_2e_2a", long}
	for _, tn := range tenants {
		if err := q.Write(ctx, record(tn, "src."+dlq.TenantToken(tn), "v:"+tn)); err != nil {
			t.Fatalf("write %q: %v", tn, err)
		}
	}
	noTenant := record("", "src.x", "orphan")
	noTenant.Reason = dlq.ReasonNoTenant
	if err := q.Write(ctx, noTenant); err != nil {
		t.Fatal(err)
	}

	info, err := q.stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != len(tenants)+1 {
		t.Fatalf("%d subjects for %d tenants + no-tenant: %v", len(info.State.Subjects), len(tenants), info.State.Subjects)
	}
	for subj, n := range info.State.Subjects {
		tok, ok := dlq.SplitNATSSubject("dead.letters", subj)
		if !ok || n != 1 || strings.ContainsAny(tok, ".*> \t") {
			t.Fatalf("subject %q (count %d) is not one plain token under the prefix", subj, n)
		}
	}
	for _, tn := range tenants {
		recs, err := q.Peek(ctx, tn, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 1 || recs[0].Tenant != tn || string(recs[0].Value) != "v:"+tn {
			t.Fatalf("tenant %q peeks %d records: %+v", tn, len(recs), recs)
		}
	}
	recs, err := q.Peek(ctx, "", 0)
	if err != nil || len(recs) != 1 || string(recs[0].Value) != "orphan" || recs[0].Reason != dlq.ReasonNoTenant {
		t.Fatalf("no-tenant bucket: %+v, %v", recs, err)
	}
	// A wildcard-looking key is a key like any other: nothing leaks to it.
	if recs, _ := q.Peek(ctx, "acme.>.*", 0); len(recs) != 0 {
		t.Fatalf("unknown tenant peeked %d records", len(recs))
	}

	sums, err := q.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range sums {
		if s.Count != 1 || s.Reason != dlq.ReasonExhausted && s.Tenant != "" || s.Oldest.IsZero() || s.Newest.Before(s.Oldest) {
			t.Errorf("summary %+v", s)
		}
		got = append(got, s.Tenant)
	}
	want := append([]string{""}, tenants...)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("Tenants = %q, want %q", got, want)
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

func TestReplayMovesRecordsAndPurgeCounts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	q := newDLQ(t, f.js)
	ctx := testCtx(t)
	// The original was published with a Msg-Id; replaying it with the same
	// id inside the dedupe window would be silently dropped.
	if _, err := f.js.PublishMsg(ctx, &nats.Msg{Subject: f.subject + ".acme", Data: []byte("m0"), Header: nats.Header{"Nats-Msg-Id": {"id-0"}}}); err != nil {
		t.Fatal(err)
	}
	for i, v := range []string{"m0", "m1", "m2"} {
		r := record("acme", f.subject+".acme", v)
		r.Redrive = i
		if i == 0 {
			r.Headers = append(r.Headers, dlq.Header{Key: "Nats-Msg-Id", Value: []byte("id-0")})
		}
		if err := q.Write(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		if err := q.Write(ctx, record("globex", f.subject+".globex", "g")); err != nil {
			t.Fatal(err)
		}
	}

	dry, err := q.Replay(ctx, "acme", dlq.ReplayOptions{DryRun: true})
	if err != nil || len(dry) != 3 {
		t.Fatalf("dry run: %d, %v", len(dry), err)
	}
	if recs, _ := q.Peek(ctx, "acme", 0); len(recs) != 3 {
		t.Fatalf("dry run removed records: %d left", len(recs))
	}
	moved, err := q.Replay(ctx, "acme", dlq.ReplayOptions{Limit: 2})
	if err != nil || len(moved) != 2 {
		t.Fatalf("replay limit 2: %d, %v", len(moved), err)
	}
	left, _ := q.Peek(ctx, "acme", 0)
	if len(left) != 1 || string(left[0].Value) != "m2" {
		t.Fatalf("after replay, DLQ holds %+v", left)
	}
	src, err := f.js.Stream(ctx, f.stream)
	if err != nil {
		t.Fatal(err)
	}
	for seq, want := range map[uint64]struct {
		v       string
		redrive int
	}{2: {"m0", 1}, 3: {"m1", 2}} {
		m, err := src.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("replayed message at %d: %v", seq, err)
		}
		hs := fromNATSHeader(m.Header)
		if string(m.Data) != want.v || dlq.RedriveCount(hs) != want.redrive || m.Header.Get("trace") != "t-1" {
			t.Fatalf("replayed %d = %q headers %v", seq, m.Data, m.Header)
		}
		if m.Header.Get("Nats-Msg-Id") != "" {
			t.Fatalf("replay kept Nats-Msg-Id")
		}
	}

	// Reason: the most common among the records, not the newest's.
	for _, reason := range []dlq.Reason{dlq.ReasonPoison, dlq.ReasonPoison, dlq.ReasonPermanent} {
		r := record("initech", f.subject+".initech", "i")
		r.Reason = reason
		if err := q.Write(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	sums, err := q.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sums {
		if s.Tenant == "initech" && (s.Reason != dlq.ReasonPoison || s.Count != 3) {
			t.Fatalf("initech summary %+v, want 3 records, most common reason poison", s)
		}
	}
	if _, err := q.Purge(ctx, "initech"); err != nil {
		t.Fatal(err)
	}

	n, err := q.Purge(ctx, "globex")
	if err != nil || n != 4 {
		t.Fatalf("purge globex = %d, %v; want 4", n, err)
	}
	if n, err := q.Purge(ctx, "nobody"); err != nil || n != 0 {
		t.Fatalf("purge nobody = %d, %v", n, err)
	}
	sums, err = q.Tenants(ctx)
	if err != nil || len(sums) != 1 || sums[0].Tenant != "acme" || sums[0].Count != 1 {
		t.Fatalf("after purge: %+v, %v", sums, err)
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

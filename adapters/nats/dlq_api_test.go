package nats

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/natstest"
)

// checkCopies checks how many stored copies each peeked dead letter lists.
func checkCopies(t *testing.T, recs []dlq.Record, want ...int) {
	t.Helper()
	for i, r := range recs {
		if len(r.Copies) != want[i] || r.Copies[0].Position != r.Position {
			t.Fatalf("dead letter %d (%q) lists copies %+v, want %d starting at its position %d", i, r.Value, r.Copies, want[i], r.Position)
		}
	}
}

// OpenDLQ refuses a stream of live data, accepts an older ringfence DLQ
// without changing it, and NewDLQ adopts and marks that one.
func TestOpenDLQTellsDLQsFromLiveStreams(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx := testCtx(t)
	sourceStream(t, js, "LIVE", "live")
	if _, err := js.Publish(ctx, "live.acme", []byte("live")); err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]DLQOption{{WithDLQStream("LIVE")}, {WithDLQStream("LIVE"), WithDLQPrefix("live")}} {
		if _, err := OpenDLQ(ctx, js, opts...); !errors.Is(err, dlq.ErrNotDLQ) {
			t.Fatalf("OpenDLQ(LIVE) = %v, want ErrNotDLQ", err)
		}
	}
	if _, err := NewDLQ(ctx, js, WithDLQStream("LIVE"), WithDLQPrefix("live")); !errors.Is(err, dlq.ErrNotDLQ) {
		t.Fatalf("NewDLQ(LIVE) = %v, want ErrNotDLQ", err)
	}
	if _, err := OpenDLQ(ctx, js, WithDLQStream("NOPE")); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("OpenDLQ(missing) = %v, want ErrStreamNotFound", err)
	}

	// A DLQ made by an older ringfence: no metadata, ringfence records.
	old := sourceStream(t, js, "OLDDLQ", "old.dlq")
	h := nats.Header{}
	for _, x := range record("acme", "src.acme", "v").EncodeHeaders() {
		h.Add(x.Key, string(x.Value))
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "old.dlq.acme", Header: h, Data: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	q, err := OpenDLQ(ctx, js, WithDLQStream("OLDDLQ"))
	if err != nil {
		t.Fatalf("OpenDLQ(an older DLQ) = %v", err)
	}
	if recs, err := q.Peek(ctx, "acme", 0); err != nil || len(recs) != 1 {
		t.Fatalf("peek an older DLQ = %d, %v", len(recs), err)
	}
	if info, err := old.Info(ctx); err != nil || info.Config.Metadata[MetaDLQ] != "" {
		t.Fatalf("OpenDLQ changed the stream: %v %v", info.Config.Metadata, err)
	}
	if _, err := NewDLQ(ctx, js, WithDLQStream("OLDDLQ"), WithDLQPrefix("old.dlq")); err != nil {
		t.Fatalf("NewDLQ(an older DLQ) = %v", err)
	}
	if info, err := old.Info(ctx); err != nil || info.Config.Metadata[MetaDLQ] != dlqFormat || info.Config.Metadata[MetaPrefix] != "old.dlq" {
		t.Fatalf("NewDLQ did not mark the older DLQ: %v %v", info.Config.Metadata, err)
	}
	// A message that is no record in an unmarked stream stops an inspection.
	other := sourceStream(t, js, "MIXED", "mixed")
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "mixed.acme", Header: h, Data: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "mixed.acme", []byte("live")); err != nil {
		t.Fatal(err)
	}
	mq, err := OpenDLQ(ctx, js, WithDLQStream("MIXED"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := mq.Purge(ctx, "acme"); !errors.Is(err, dlq.ErrNotDLQ) {
		t.Fatalf("purge of a stream holding live data = %d, %v; want ErrNotDLQ", n, err)
	}
	if info, _ := other.Info(ctx); info.State.Msgs != 2 {
		t.Fatalf("refused purge left %d of 2 messages", info.State.Msgs)
	}
}

// Where even the record pointing to a stored body cannot fit, Write says
// ErrUnwritable; a server that is down is a plain error.
func TestWriteUnwritableOnlyWhenItCannotFit(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx := testCtx(t)
	q, err := NewDLQ(ctx, js, WithDLQStream("TINY"), WithDLQPrefix("tiny"))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := js.Stream(ctx, "TINY")
	cfg := st.CachedInfo().Config
	cfg.MaxMsgSize = 300
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if q, err = NewDLQ(ctx, js, WithDLQStream("TINY")); err != nil {
		t.Fatal(err)
	}
	r := record("acme", "src.acme", "a value that is stored out of line")
	r.Error = strings.Repeat("e", 400)
	err = q.Write(ctx, r)
	if !errors.Is(err, dlq.ErrUnwritable) {
		t.Fatalf("a record whose pointer exceeds the stream's max message size: %v, want ErrUnwritable", err)
	}
	checkNoBodies(t, js)

	srv.Shutdown()
	down, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := q.Write(down, record("acme", "src.acme", "x")); err == nil || errors.Is(err, dlq.ErrUnwritable) {
		t.Fatalf("a server that is down: %v, want a transient error", err)
	}
}

// Bytes a NATS header cannot carry (CR, LF, surrounding spaces, a header
// name NATS refuses, a message key) survive a dead letter exactly.
func TestRecordKeepsWhatNATSHeadersCannot(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx := testCtx(t)
	q, err := NewDLQ(ctx, js, WithDLQStream("EXACT"), WithDLQPrefix("exact"))
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("line\r\n", 50) // hashed, and NATS would turn CR/LF into spaces
	r := record(long, "src.x", " value ")
	r.Key = []byte{}
	r.Headers = []dlq.Header{{Key: "multi", Value: []byte("a\r\nb")}, {Key: "pad", Value: []byte("  x  ")}, {Key: "bad:key", Value: []byte("v")}}
	if err := q.Write(ctx, r); err != nil {
		t.Fatal(err)
	}
	recs, err := q.Peek(ctx, long, 0)
	if err != nil || len(recs) != 1 {
		t.Fatalf("peek = %d, %v", len(recs), err)
	}
	g := recs[0]
	if g.Tenant != long || string(g.Value) != " value " || g.Key == nil || len(g.Key) != 0 || len(g.Headers) != 3 {
		t.Fatalf("record came back as tenant %q key %v value %q headers %q", g.Tenant, g.Key, g.Value, g.Headers)
	}
	for i, h := range r.Headers {
		if g.Headers[i].Key != h.Key || !bytes.Equal(g.Headers[i].Value, h.Value) {
			t.Fatalf("header %d came back as %q=%q, want %q=%q", i, g.Headers[i].Key, g.Headers[i].Value, h.Key, h.Value)
		}
	}
	sums, err := q.Tenants(ctx)
	if err != nil || len(sums) != 1 || sums[0].Tenant != long {
		t.Fatalf("tenants = %+v, %v", sums, err)
	}

	// A dead letter from a Kafka source with a 1 MiB tenant key (and the
	// same message key): both kept, in a stream whose messages cannot
	// carry either.
	huge := strings.Repeat("t", 1<<20)
	k := record(huge, "orders", "v")
	k.Key = []byte(huge)
	if err := q.Write(ctx, k); err != nil {
		t.Fatalf("a 1 MiB tenant key: %v", err)
	}
	recs, err = q.Peek(ctx, huge, 0)
	if err != nil || len(recs) != 1 || recs[0].Tenant != huge || string(recs[0].Key) != huge || string(recs[0].Value) != "v" {
		t.Fatalf("peek the 1 MiB tenant: %d, %v", len(recs), err)
	}
}

func FuzzBody(f *testing.F) {
	f.Add("acme", []byte("k"), []byte("value"), "h", []byte("v"), true)
	f.Add("", []byte(nil), []byte(nil), "", []byte(nil), false)
	f.Add("\x00\xff", []byte{}, []byte("\r\n"), "Nats-Msg-Id", []byte("x"), true)
	f.Fuzz(func(t *testing.T, tenant string, key, value []byte, hk string, hv []byte, withHeader bool) {
		var hs []dlq.Header
		if withHeader {
			hs = []dlq.Header{{Key: hk, Value: hv}, {Key: hk, Value: value}}
		}
		b := encodeBody(tenant, key, value, hs)
		gt, gk, gv, gh, err := decodeBody(b)
		if err != nil {
			t.Fatalf("decode(encode) = %v", err)
		}
		if gt != tenant || !bytes.Equal(gk, key) || (gk == nil) != (key == nil) || !bytes.Equal(gv, value) || len(gh) != len(hs) {
			t.Fatalf("round trip: %q %q %q %d", gt, gk, gv, len(gh))
		}
		for i := range hs {
			if gh[i].Key != hs[i].Key || !bytes.Equal(gh[i].Value, hs[i].Value) {
				t.Fatalf("header %d: %q=%q", i, gh[i].Key, gh[i].Value)
			}
		}
		// Any bytes: an error or a body, never a panic or a huge allocation.
		_, _, _, _, _ = decodeBody(value)
		_, _, _, _, _ = decodeBody(append([]byte(bodyMagic), value...))
	})
}

func TestTooLarge(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err  error
		want bool
	}{
		{&jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamMessageExceedsMaximum}, true},
		{&jetstream.APIError{ErrorCode: jsHeaderTooLarge}, true},
		{nats.ErrMaxPayload, true},
		{&jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamNotFound}, false},
		{nats.ErrTimeout, false},
		{context.DeadlineExceeded, false},
		{jetstream.ErrNoStreamResponse, false},
	}
	for _, tc := range cases {
		if got := tooLarge(tc.err); got != tc.want {
			t.Errorf("tooLarge(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

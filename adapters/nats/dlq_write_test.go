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

// sourceStream makes a stream "<name>" taking "<subject>.>".
func sourceStream(t testing.TB, js jetstream.JetStream, name, subject string) jetstream.Stream {
	t.Helper()
	st, err := js.CreateStream(testCtx(t), jetstream.StreamConfig{Name: name, Subjects: []string{subject + ".>"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// deadLetterOf is the record the engine makes of a stored message.
func deadLetterOf(raw *jetstream.RawStreamMsg, stream, tenant string) *dlq.Record {
	now := time.Now().UTC()
	return &dlq.Record{
		Tenant: tenant, Value: raw.Data, Headers: fromNATSHeader(raw.Header),
		Source: raw.Subject, Offset: -1, Stream: stream, Sequence: raw.Sequence, Group: "work",
		Attempts: 3, FirstFailure: now, LastFailure: now, Error: "too big to handle", Reason: dlq.ReasonExhausted,
	}
}

func sameNATSHeaders(t *testing.T, got []dlq.Header, want nats.Header) {
	t.Helper()
	w := fromNATSHeader(want)
	if len(got) != len(w) {
		t.Fatalf("headers: %d, want %d", len(got), len(w))
	}
	for i := range got {
		if got[i].Key != w[i].Key || !bytes.Equal(got[i].Value, w[i].Value) {
			t.Fatalf("header %d: %q=%d bytes, want %q=%d bytes", i, got[i].Key, len(got[i].Value), w[i].Key, len(w[i].Value))
		}
	}
}

// A message at the server's max payload is dead-lettered, peeked and
// replayed byte for byte.
func TestDeadLetterAtMaxPayload(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	nc, js := srv.JetStream(t)
	ctx := testCtx(t)
	src := sourceStream(t, js, "BIG", "big")
	max := int(nc.MaxPayload())
	body := bytes.Repeat([]byte("0123456789abcdef"), max/16+1)[:max]
	body[0], body[max-1] = 0xff, 0x00
	ack, err := js.Publish(ctx, "big.acme", body)
	if err != nil {
		t.Fatalf("the server refuses a message at its max payload: %v", err)
	}
	if _, err := js.Publish(ctx, "big.acme", append(bytes.Clone(body), 'x')); err == nil {
		t.Fatal("a message one byte over max payload was accepted: the test's message is not at the limit")
	}
	raw, err := src.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	q, err := NewDLQ(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Write(ctx, deadLetterOf(raw, "BIG", "acme")); err != nil {
		t.Fatalf("dead-letter a message at max payload: %v", err)
	}
	recs, err := q.Peek(ctx, "acme", 0)
	if err != nil || len(recs) != 1 || !bytes.Equal(recs[0].Value, body) || recs[0].Sequence != ack.Sequence || recs[0].Tenant != "acme" {
		t.Fatalf("peek = %d records, %v", len(recs), err)
	}
	moved, err := q.Replay(ctx, "acme", dlq.ReplayOptions{})
	if err != nil || len(moved) != 1 {
		t.Fatalf("replay = %d, %v", len(moved), err)
	}
	back, err := src.GetLastMsgForSubject(ctx, "big.acme")
	if err != nil || back.Sequence == ack.Sequence || !bytes.Equal(back.Data, body) {
		t.Fatalf("replayed message: %v (sequence %d), %d bytes; want %d byte for byte", err, back.Sequence, len(back.Data), len(body))
	}
	if recs, err := q.Peek(ctx, "acme", 0); err != nil || len(recs) != 0 {
		t.Fatalf("after replay the DLQ holds %d, %v", len(recs), err)
	}
	checkNoBodies(t, js)
}

// A message whose tenant key, in a header, is as long as JetStream lets a
// header block be (64 KiB), in a message at max payload, is dead-lettered
// although the record would carry the key twice; its record keeps the full
// key, is listed under it, peeked and purged byte for byte (JetStream caps
// a header block at 65535 bytes, so a 1 MiB key can only come from a Kafka
// source).
func TestDeadLetterWithHugeTenantKey(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	nc, js := srv.JetStream(t)
	ctx := testCtx(t)
	src := sourceStream(t, js, "KEYS", "keys")
	const block = 65535
	// "NATS/1.0\r\n" + "tenant: <key>\r\n" + "\r\n" is the header block.
	keyLen := block - len("NATS/1.0\r\n") - len("tenant: \r\n") - len("\r\n")
	key := strings.Repeat("k.", keyLen/2+1)[:keyLen]
	body := bytes.Repeat([]byte("b"), int(nc.MaxPayload())-block)
	h := nats.Header{}
	h.Set("tenant", key)
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: "keys.x", Header: h, Data: body})
	if err != nil {
		t.Fatalf("publish a message with a %d-byte tenant key: %v", keyLen, err)
	}
	raw, err := src.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	q, err := NewDLQ(ctx, js, WithDLQStream("KEYDLQ"), WithDLQPrefix("keydlq"))
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Write(ctx, deadLetterOf(raw, "KEYS", key)); err != nil {
		t.Fatalf("dead-letter a message with a %d-byte tenant key: %v", keyLen, err)
	}
	sums, err := q.Tenants(ctx)
	if err != nil || len(sums) != 1 || sums[0].Tenant != key || sums[0].Count != 1 {
		t.Fatalf("tenants = %d, %v; want the full key once", len(sums), err)
	}
	recs, err := q.Peek(ctx, key, 0)
	if err != nil || len(recs) != 1 || recs[0].Tenant != key || !bytes.Equal(recs[0].Value, body) {
		t.Fatalf("peek = %d, %v", len(recs), err)
	}
	sameNATSHeaders(t, recs[0].Headers, raw.Header)
	if n, err := q.Purge(ctx, key); err != nil || n != 1 {
		t.Fatalf("purge = %d, %v", n, err)
	}
	checkNoBodies(t, js)
}

// A dead letter written three times is one record in the stream (the
// duplicate window); copies the window did not catch (written apart in
// time, or without a Nats-Msg-Id) still count as one dead letter.
func TestCopiesOfOneMessageAreStoredOnce(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx := testCtx(t)
	q, err := NewDLQ(ctx, js, WithDLQStream("CPDLQ"), WithDLQPrefix("cpdlq"))
	if err != nil {
		t.Fatal(err)
	}
	r := record("acme", "cp.acme", "poison")
	for range 3 {
		if err := q.Write(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if info, err := q.stream.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("the DLQ stream holds %d records for one message written three times, %v", info.State.Msgs, err)
	}
	legacy := nats.Header{}
	for _, x := range r.EncodeHeaders() {
		legacy.Add(x.Key, string(x.Value))
	}
	for range 2 {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "cpdlq.acme", Header: legacy, Data: r.Value}); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := q.Peek(ctx, "acme", 0)
	if err != nil || len(recs) != 1 || len(recs[0].Copies) != 3 {
		t.Fatalf("peek = %d dead letters, %v; want poison once with 3 copies", len(recs), err)
	}
}

// checkNoBodies fails if an object store bucket still holds an object.
func checkNoBodies(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx := testCtx(t)
	for name := range js.ObjectStoreNames(ctx).Name() {
		os, err := js.ObjectStore(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if objs := listBodies(t, os, name); len(objs) != 0 {
			t.Fatalf("bucket %s still holds %d bodies: %v", name, len(objs), objs)
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
	cfg := q.stream.CachedInfo().Config
	cfg.MaxMsgSize = 300
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if q, err = NewDLQ(ctx, js, WithDLQStream("TINY")); err != nil { // sees the new limit
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

func TestWhichErrorsMeanTooLarge(t *testing.T) {
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

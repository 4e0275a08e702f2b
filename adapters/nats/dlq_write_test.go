package nats

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/natstest"
)

// Tests for issue 15 (dead letters that cannot be written, a DLQ CLI that
// cannot hurt live data). They use only what the package exported before
// that issue where they can, so that they can be run against the code that
// had the defects.

// sourceStream makes a stream "<name>" taking "<subject>.>".
func sourceStream(t *testing.T, js jetstream.JetStream, name, subject string) jetstream.Stream {
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
// replayed byte for byte (issue 15 item 1).
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
// key, is listed under it, peeked and purged byte for byte (issue 15 item
// 1; JetStream caps a header block at 65535 bytes, so a 1 MiB key can only
// come from a Kafka source).
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

// One message dead-lettered three times is one record in the stream (the
// duplicate window), and copies written past it (or by an older version)
// are one dead letter: one row, count 1, one replay (issue 15 item 7).
func TestCopiesOfOneMessageCountOnce(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx := testCtx(t)
	src := sourceStream(t, js, "CP", "cp")
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
	st, err := js.Stream(ctx, "CPDLQ")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("the DLQ stream holds %d records for one message written three times, %v", info.State.Msgs, err)
	}
	// Copies the duplicate window did not catch (written apart in time, or
	// by an older ringfence): the same headers, no Nats-Msg-Id.
	legacy := nats.Header{}
	for _, x := range r.EncodeHeaders() {
		legacy.Add(x.Key, string(x.Value))
	}
	for range 2 {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "cpdlq.acme", Header: legacy, Data: r.Value}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Write(ctx, record("acme", "cp.acme", "other")); err != nil {
		t.Fatal(err)
	}
	sums, err := q.Tenants(ctx)
	if err != nil || len(sums) != 1 || sums[0].Count != 2 {
		t.Fatalf("tenants = %+v, %v; want acme with 2 dead letters", sums, err)
	}
	recs, err := q.Peek(ctx, "acme", 0)
	if err != nil || len(recs) != 2 || string(recs[0].Value) != "poison" || string(recs[1].Value) != "other" {
		t.Fatalf("peek = %d, %v; want poison once, then other", len(recs), err)
	}
	checkCopies(t, recs, 3, 1)
	moved, err := q.Replay(ctx, "acme", dlq.ReplayOptions{Limit: 1})
	if err != nil || len(moved) != 1 {
		t.Fatalf("replay = %d, %v", len(moved), err)
	}
	if info, err := src.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("the source got %d messages back, want 1 (%v)", info.State.Msgs, err)
	}
	left, err := q.Peek(ctx, "acme", 0)
	if err != nil || len(left) != 1 || string(left[0].Value) != "other" {
		t.Fatalf("after replay: %d left, %v; want other only", len(left), err)
	}
}

// A stream of live data is not a DLQ: an inspector refuses it, whatever
// prefix it is given, and deletes nothing (issue 15 item 2).
func TestLiveStreamIsNotADLQ(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx := testCtx(t)
	live := sourceStream(t, js, "LIVE", "live")
	for i := range 3 {
		if _, err := js.Publish(ctx, "live.acme", []byte(fmt.Sprintf("live-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	q, err := NewDLQ(ctx, js, WithDLQStream("LIVE"), WithDLQPrefix("live"))
	if err == nil {
		// An older version opened it: purging must still refuse.
		if n, err := q.Purge(ctx, "acme"); err == nil {
			t.Fatalf("purge of live data = %d, nil error", n)
		}
	}
	if info, err := live.Info(ctx); err != nil || info.State.Msgs != 3 {
		t.Fatalf("live stream holds %d messages after a refused purge, want 3 (%v)", info.State.Msgs, err)
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

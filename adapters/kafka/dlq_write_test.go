package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ringfence/ringfence/dlq"
)

// Tests for issue 15 (dead letters that cannot be written, a DLQ CLI that
// cannot hurt live data) and the DLQ-topic item of issue 14. They use only
// what the package exported before those issues where they can, so that
// they can be run against the code that had the defects.

// atLimit returns a value length that makes a one-record batch of key,
// headers and that value exactly limit bytes, as a broker counts it.
func atLimit(t *testing.T, key []byte, headers []kafkago.Header, limit int) int {
	t.Helper()
	size := func(n int) int {
		body := 1 + 1 + 1 // attributes, timestamp delta, offset delta
		body += vlen(len(key)) + len(key) + vlen(n) + n + vlen(len(headers))
		for _, h := range headers {
			body += vlen(len(h.Key)) + len(h.Key) + vlen(len(h.Value)) + len(h.Value)
		}
		return 61 + vlen(body) + body
	}
	for n := limit - 300; n < limit; n++ {
		if size(n) == limit {
			return n
		}
	}
	t.Fatalf("no value length makes a %d-byte batch", limit)
	return 0
}

// vlen is the length of n as a zigzag varint.
func vlen(n int) int {
	u := uint64(n) << 1
	l := 1
	for u >= 0x80 {
		u >>= 7
		l++
	}
	return l
}

// produceOne writes one message in a batch of its own (as a producer at the
// limit must) and returns its offset.
func produceOne(ctx context.Context, addrs []string, topic string, m kafkago.Message) (int64, error) {
	cl := &kafkago.Client{Addr: kafkago.TCP(addrs...)}
	resp, err := cl.Produce(ctx, &kafkago.ProduceRequest{
		Topic: topic, RequiredAcks: kafkago.RequireAll,
		Records: kafkago.NewRecordReader(kafkago.Record{Time: time.Now(), Key: kafkago.NewBytes(m.Key), Value: kafkago.NewBytes(m.Value), Headers: m.Headers}),
	})
	if err != nil {
		return 0, err
	}
	return resp.BaseOffset, resp.Error
}

// fetchAt reads the record at offset of topic/0 with the protocol-level
// decoder, which keeps a null header value apart from an empty one. It uses
// a transport of its own: kafka-go's default one caches metadata for 6s
// and may not know a topic made since.
func fetchAt(t *testing.T, addrs []string, topic string, offset int64) *kafkago.Record {
	t.Helper()
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafkago.Client{Addr: kafkago.TCP(addrs...), Transport: tr}
	resp, err := cl.Fetch(testCtx(t, 30*time.Second), &kafkago.FetchRequest{Topic: topic, Offset: offset, MinBytes: 1, MaxBytes: 64 << 20, MaxWait: time.Second})
	if err == nil {
		err = resp.Error
	}
	if err != nil {
		t.Fatalf("fetch %s at %d: %v", topic, offset, err)
	}
	for {
		r, err := resp.Records.ReadRecord()
		if err != nil {
			t.Fatalf("no record at %s/%d: %v", topic, offset, err)
		}
		if r.Offset == offset {
			return r
		}
	}
}

func readAllBytes(t *testing.T, b kafkago.Bytes) []byte {
	t.Helper()
	if b == nil {
		return nil
	}
	out, err := io.ReadAll(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameHeaders(a []dlq.Header, b []kafkago.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !bytes.Equal(a[i].Value, b[i].Value) || (a[i].Value == nil) != (b[i].Value == nil) {
			return false
		}
	}
	return true
}

// bigRecord is the dead letter the engine makes of m, read at offset.
func bigRecord(source, tenant string, m kafkago.Message, offset int64) *dlq.Record {
	now := time.Now().UTC()
	hs := make([]dlq.Header, len(m.Headers))
	for i, h := range m.Headers {
		hs[i] = dlq.Header{Key: h.Key, Value: h.Value}
	}
	return &dlq.Record{
		Tenant: tenant, Key: m.Key, Value: m.Value, Headers: hs,
		Source: source, Partition: 0, Offset: offset, Group: "g", Attempts: 3,
		FirstFailure: now, LastFailure: now, Error: "too big to handle", Reason: dlq.ReasonExhausted,
	}
}

// A message at the broker's own limit (message.max.bytes 16 MiB) is
// dead-lettered, peeked and replayed byte for byte (issue 15 item 1).
func TestDeadLetterAtBrokerLimit(t *testing.T) {
	t.Parallel()
	const limit = 16 << 20
	c := startCluster(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(limit)}))
	ctx := testCtx(t, 120*time.Second)
	source := uniq("big")
	if err := createTopic(ctx, &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}, source, 1, -1); err != nil {
		t.Fatal(err)
	}
	m := kafkago.Message{Key: []byte("order-1"), Headers: []kafkago.Header{{Key: "tenant", Value: []byte("acme")}, {Key: "trace", Value: []byte{}}}}
	m.Value = bytes.Repeat([]byte("0123456789abcdef"), limit/16)[:atLimit(t, m.Key, m.Headers, limit)]
	m.Value[0], m.Value[len(m.Value)-1] = 0xff, 0x00
	off, err := produceOne(ctx, c.Addrs(), source, m)
	if err != nil {
		t.Fatalf("the broker refuses a message at its limit: %v", err)
	}
	over := m
	over.Value = append(bytes.Clone(m.Value), 'x')
	if _, err := produceOne(ctx, c.Addrs(), source, over); !errors.Is(err, kafkago.MessageSizeTooLarge) {
		t.Fatalf("a message one byte over the limit: %v, want MessageSizeTooLarge (the test's message is not at the limit)", err)
	}

	sink, err := NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if err := sink.Write(ctx, bigRecord(source, "acme", m, off)); err != nil {
		t.Fatalf("dead-letter a message at the broker's limit: %v", err)
	}
	in, err := NewInspector(c.Addrs(), source)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	recs, err := in.Peek(ctx, "acme", 0)
	if err != nil || len(recs) != 1 {
		t.Fatalf("peek = %d records, %v", len(recs), err)
	}
	if r := recs[0]; !bytes.Equal(r.Value, m.Value) || !bytes.Equal(r.Key, m.Key) || !sameHeaders(r.Headers, m.Headers) {
		t.Fatalf("peeked record differs: value %d bytes (want %d), key %q, headers %q", len(r.Value), len(m.Value), r.Key, r.Headers)
	}
	moved, err := in.Replay(ctx, "acme", dlq.ReplayOptions{})
	if err != nil || len(moved) != 1 {
		t.Fatalf("replay = %d, %v", len(moved), err)
	}
	got := fetchAt(t, c.Addrs(), source, off+1)
	if v := readAllBytes(t, got.Value); !bytes.Equal(v, m.Value) || !bytes.Equal(readAllBytes(t, got.Key), m.Key) {
		t.Fatalf("replayed value %d bytes, want %d byte for byte", len(v), len(m.Value))
	}
	// At the limit there is no room for the redrive header: the message
	// goes back exactly as it was.
	if len(got.Headers) != len(m.Headers) || got.Headers[0].Key != "tenant" || string(got.Headers[0].Value) != "acme" || got.Headers[1].Value == nil {
		t.Fatalf("replayed headers %q, want %q", got.Headers, m.Headers)
	}
}

// A message whose tenant key is about 1 MiB (the key of a message at the
// default 1 MiB limit) is dead-lettered although key and tenant header
// together are twice the source's limit, listed with its full key, peeked
// and replayed byte for byte (issue 15 item 1).
func TestDeadLetterWithHugeTenantKey(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := testCtx(t, 60*time.Second)
	source := uniq("keys")
	if err := createTopic(ctx, &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}, source, 1, -1); err != nil {
		t.Fatal(err)
	}
	const limit = 1048588 // Kafka's default message.max.bytes
	m := kafkago.Message{Value: []byte("v")}
	keyLen := atLimit(t, m.Value, nil, limit) // the same arithmetic with the key as the big part
	m.Key = bytes.Repeat([]byte("tenant/"), keyLen/7+1)[:keyLen]
	off, err := produceOne(ctx, c.Addrs(), source, m)
	if err != nil {
		t.Fatalf("produce a message with a %d-byte key: %v", keyLen, err)
	}
	tenant := string(m.Key)
	sink, err := NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if err := sink.Write(ctx, bigRecord(source, tenant, m, off)); err != nil {
		t.Fatalf("dead-letter a message with a %d-byte tenant key: %v", keyLen, err)
	}
	in, err := NewInspector(c.Addrs(), source)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	sums, err := in.Tenants(ctx)
	if err != nil || len(sums) != 1 || sums[0].Tenant != tenant || sums[0].Count != 1 {
		t.Fatalf("tenants = %d, %v", len(sums), err)
	}
	recs, err := in.Peek(ctx, tenant, 0)
	if err != nil || len(recs) != 1 || recs[0].Tenant != tenant || !bytes.Equal(recs[0].Key, m.Key) || !bytes.Equal(recs[0].Value, m.Value) {
		t.Fatalf("peek = %d records, %v", len(recs), err)
	}
	if moved, err := in.Replay(ctx, tenant, dlq.ReplayOptions{}); err != nil || len(moved) != 1 {
		t.Fatalf("replay = %d, %v", len(moved), err)
	}
	if got := fetchAt(t, c.Addrs(), source, off+1); !bytes.Equal(readAllBytes(t, got.Key), m.Key) || !bytes.Equal(readAllBytes(t, got.Value), m.Value) {
		t.Fatal("replayed message differs from the original")
	}
}

// Kafka tells a null header value from an empty one; a dead letter and its
// replay keep the difference (issue 15 item 5).
func TestEmptyHeaderValueIsNotNull(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := testCtx(t, 60*time.Second)
	source := uniq("hdr")
	if err := createTopic(ctx, &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}, source, 1, -1); err != nil {
		t.Fatal(err)
	}
	sink, err := NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	r := &dlq.Record{
		Tenant: "acme", Key: []byte{}, Value: []byte("v"), Source: source, Offset: 0, Reason: dlq.ReasonPermanent,
		Headers: []dlq.Header{{Key: "tenant", Value: []byte{}}, {Key: "trace", Value: nil}},
	}
	if err := sink.Write(ctx, r); err != nil {
		t.Fatal(err)
	}
	in, err := NewInspector(c.Addrs(), source)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	recs, err := in.Peek(ctx, "acme", 0)
	if err != nil || len(recs) != 1 {
		t.Fatalf("peek = %d, %v", len(recs), err)
	}
	hs := recs[0].Headers
	if len(hs) != 2 || hs[0].Value == nil || len(hs[0].Value) != 0 || hs[1].Value != nil {
		t.Fatalf("peeked headers %#v: want tenant empty (not null) and trace null", hs)
	}
	if recs[0].Key == nil {
		t.Fatal("peeked key is null, want empty")
	}
	if _, err := in.Replay(ctx, "acme", dlq.ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	got := fetchAt(t, c.Addrs(), source, 0)
	var tenant, trace *kafkago.Header
	for i := range got.Headers {
		switch got.Headers[i].Key {
		case "tenant":
			tenant = &got.Headers[i]
		case "trace":
			trace = &got.Headers[i]
		}
	}
	if tenant == nil || tenant.Value == nil || trace == nil || trace.Value != nil {
		t.Fatalf("replayed headers %#v: want tenant empty (not null) and trace null", got.Headers)
	}
}

// One message dead-lettered three times (redeliveries) is one dead letter:
// one row, count 1, one peeked record, one replay; a later copy of a
// replayed message stays hidden (issue 15 item 7).
func TestCopiesOfOneMessageCountOnce(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := testCtx(t, 60*time.Second)
	source := uniq("copies")
	if err := createTopic(ctx, &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}, source, 1, -1); err != nil {
		t.Fatal(err)
	}
	sink, err := NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	in, err := NewInspector(c.Addrs(), source)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	poison := func(attempts int) *dlq.Record {
		return &dlq.Record{Tenant: "acme", Value: []byte("poison"), Source: source, Partition: 0, Offset: 41, Attempts: attempts, Reason: dlq.ReasonPoison}
	}
	other := &dlq.Record{Tenant: "acme", Value: []byte("other"), Source: source, Partition: 0, Offset: 42, Reason: dlq.ReasonPermanent}
	for _, r := range []*dlq.Record{poison(1), poison(2), other, poison(3)} {
		if err := sink.Write(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	sums, err := in.Tenants(ctx)
	if err != nil || len(sums) != 1 || sums[0].Count != 2 {
		t.Fatalf("tenants = %+v, %v; want acme with 2 dead letters", sums, err)
	}
	recs, err := in.Peek(ctx, "acme", 0)
	if err != nil || len(recs) != 2 || string(recs[0].Value) != "poison" || string(recs[1].Value) != "other" {
		t.Fatalf("peek = %q, %v; want poison once, then other", values(recs), err)
	}
	checkCopies(t, recs, 3, 1)
	moved, err := in.Replay(ctx, "acme", dlq.ReplayOptions{Limit: 1})
	if err != nil || len(moved) != 1 || string(moved[0].Value) != "poison" {
		t.Fatalf("replay = %q, %v", values(moved), err)
	}
	if n := countValues(t, c.Addrs(), source, "poison"); n != 1 {
		t.Fatalf("the source got %d copies of the poison message back, want 1", n)
	}
	if err := sink.Write(ctx, poison(4)); err != nil { // a late copy
		t.Fatal(err)
	}
	left, err := in.Peek(ctx, "acme", 0)
	if err != nil || len(left) != 1 || string(left[0].Value) != "other" {
		t.Fatalf("after replaying poison, peek = %q, %v; want other only", values(left), err)
	}
	if n, err := in.Purge(ctx, "acme"); err != nil || n != 1 {
		t.Fatalf("purge = %d, %v", n, err)
	}
}

// countValues counts the messages of topic/0 whose value is v.
func countValues(t *testing.T, addrs []string, topic, v string) int {
	t.Helper()
	cl := &kafkago.Client{Addr: kafkago.TCP(addrs...)}
	ctx := testCtx(t, 30*time.Second)
	lo, err := cl.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: {kafkago.LastOffsetOf(0)}}})
	if err != nil {
		t.Fatal(err)
	}
	end := lo.Topics[topic][0].LastOffset
	n := 0
	for off := int64(0); off < end; off++ {
		if string(readAllBytes(t, fetchAt(t, addrs, topic, off).Value)) == v {
			n++
		}
	}
	return n
}

// A topic named like a DLQ that holds records without ringfence- headers is
// not a DLQ: the inspector refuses it and changes nothing (issue 15 item 2).
func TestInspectorRefusesTopicThatIsNotADLQ(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := testCtx(t, 60*time.Second)
	source := uniq("live")
	live := dlq.KafkaTopic(source, "acme")
	if err := createTopic(ctx, &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}, live, 1, -1); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := produceOne(ctx, c.Addrs(), live, kafkago.Message{Value: []byte(fmt.Sprintf("live-%d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	in, err := NewInspector(c.Addrs(), source)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if _, err := in.Tenants(ctx); err == nil {
		t.Fatal("Tenants read a topic of live data as a DLQ")
	}
	if _, err := in.Peek(ctx, "acme", 0); err == nil {
		t.Fatal("Peek read a topic of live data as a DLQ")
	}
	if _, err := in.Replay(ctx, "acme", dlq.ReplayOptions{}); err == nil {
		t.Fatal("Replay moved live data")
	}
	n, err := in.Purge(ctx, "acme")
	if err == nil || n != 0 {
		t.Fatalf("Purge of live data = %d, %v; want an error", n, err)
	}
	if !strings.Contains(err.Error(), "not a ringfence dead-letter queue") {
		t.Fatalf("purge error %q does not say the topic is not a DLQ", err)
	}
	if cur := committed(t, c.Addrs(), DefaultCursorGroup, live, 1); cur[0] > 0 {
		t.Fatalf("the refused purge moved the cursor to %d", cur[0])
	}
	if got := string(readAllBytes(t, fetchAt(t, c.Addrs(), live, 0).Value)); got != "live-0" {
		t.Fatalf("live data changed: %q", got)
	}
}

// Creating one tenant's DLQ topic is a network call; while it is slow,
// other tenants' dead letters still go through (issue 14 item 8).
func TestSlowTopicCreationStallsNoOtherTenant(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := testCtx(t, 60*time.Second)
	source := uniq("slow")
	slowTopic := dlq.KafkaTopic(source, "slow")
	release, seen := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free)
	var slowSeen atomic.Bool
	c.Kfake().ControlKey(kmsg.CreateTopics.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.Kfake().KeepControl()
		for _, tp := range req.(*kmsg.CreateTopicsRequest).Topics {
			if tp.Topic == slowTopic && slowSeen.CompareAndSwap(false, true) {
				close(seen)
				c.Kfake().SleepControl(func() { <-release })
			}
		}
		return nil, nil, false // let the broker create it
	})
	sink, err := NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	slowDone := make(chan error, 1)
	go func() {
		slowDone <- sink.Write(ctx, &dlq.Record{Tenant: "slow", Value: []byte("s"), Source: source, Offset: 1, Reason: dlq.ReasonPermanent})
	}()
	select {
	case <-seen:
	case <-ctx.Done():
		t.Fatal("the slow tenant's topic creation never reached the broker")
	}
	fast, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := sink.Write(fast, &dlq.Record{Tenant: "fast", Value: []byte("f"), Source: source, Offset: 2, Reason: dlq.ReasonPermanent}); err != nil {
		t.Fatalf("another tenant's dead letter waited for the slow topic creation: %v", err)
	}
	select {
	case err := <-slowDone:
		t.Fatalf("the slow write finished before its creation was released: %v", err)
	default:
	}
	free()
	if err := <-slowDone; err != nil {
		t.Fatalf("slow tenant's write: %v", err)
	}
}

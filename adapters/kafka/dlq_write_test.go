package kafka

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ringfence/ringfence/dlq"
)

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

// recordAt returns the record at offset of topic/0.
func recordAt(t testing.TB, addrs []string, topic string, offset int64) *fetched {
	t.Helper()
	for _, r := range readTopic(t, addrs, topic) {
		if r.offset == offset {
			return r
		}
	}
	t.Fatalf("no record at %s/0 offset %d", topic, offset)
	return nil
}

// A message at the broker's own limit (message.max.bytes 16 MiB) is
// dead-lettered, peeked and replayed byte for byte.
func TestDeadLetterAtBrokerLimit(t *testing.T) {
	t.Parallel()
	const limit = 16 << 20
	h := newDLQHarness(t, false, kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(limit)}))
	c, source := h.c, h.source
	ctx := testCtx(t, 120*time.Second)
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

	q := h.open(t)
	if err := q.Write(ctx, bigRecord(source, "acme", m, off)); err != nil {
		t.Fatalf("dead-letter a message at the broker's limit: %v", err)
	}
	recs, err := q.Peek(ctx, "acme", 0)
	if err != nil || len(recs) != 1 {
		t.Fatalf("peek = %d records, %v", len(recs), err)
	}
	if r := recs[0]; !bytes.Equal(r.Value, m.Value) || !bytes.Equal(r.Key, m.Key) || !sameHeaders(r.Headers, m.Headers) {
		t.Fatalf("peeked record differs: value %d bytes (want %d), key %q, headers %q", len(r.Value), len(m.Value), r.Key, r.Headers)
	}
	moved, err := q.Replay(ctx, "acme", dlq.ReplayOptions{})
	if err != nil || len(moved) != 1 {
		t.Fatalf("replay = %d, %v", len(moved), err)
	}
	got := recordAt(t, c.Addrs(), source, off+1)
	if !bytes.Equal(got.value, m.Value) || !bytes.Equal(got.key, m.Key) {
		t.Fatalf("replayed value %d bytes, want %d byte for byte", len(got.value), len(m.Value))
	}
	// At the limit there is no room for the redrive header: the message
	// goes back exactly as it was.
	if !sameHeaders(got.headers, m.Headers) {
		t.Fatalf("replayed headers %q, want %q", got.headers, m.Headers)
	}
}

// A message whose tenant key is about 1 MiB (the key of a message at the
// default 1 MiB limit) is dead-lettered although key and tenant header
// together are twice the source's limit, listed with its full key, peeked
// and replayed byte for byte.
func TestDeadLetterWithHugeTenantKey(t *testing.T) {
	t.Parallel()
	h := newDLQHarness(t, false)
	c, source := h.c, h.source
	ctx := testCtx(t, 60*time.Second)
	const limit = 1048588 // Kafka's default message.max.bytes
	m := kafkago.Message{Value: []byte("v")}
	keyLen := atLimit(t, m.Value, nil, limit) // the same arithmetic with the key as the big part
	m.Key = bytes.Repeat([]byte("tenant/"), keyLen/7+1)[:keyLen]
	off, err := produceOne(ctx, c.Addrs(), source, m)
	if err != nil {
		t.Fatalf("produce a message with a %d-byte key: %v", keyLen, err)
	}
	tenant := string(m.Key)
	q := h.open(t)
	if err := q.Write(ctx, bigRecord(source, tenant, m, off)); err != nil {
		t.Fatalf("dead-letter a message with a %d-byte tenant key: %v", keyLen, err)
	}
	sums, err := q.Tenants(ctx)
	if err != nil || len(sums) != 1 || sums[0].Tenant != tenant || sums[0].Count != 1 {
		t.Fatalf("tenants = %d, %v", len(sums), err)
	}
	recs, err := q.Peek(ctx, tenant, 0)
	if err != nil || len(recs) != 1 || recs[0].Tenant != tenant || !bytes.Equal(recs[0].Key, m.Key) || !bytes.Equal(recs[0].Value, m.Value) {
		t.Fatalf("peek = %d records, %v", len(recs), err)
	}
	if moved, err := q.Replay(ctx, tenant, dlq.ReplayOptions{}); err != nil || len(moved) != 1 {
		t.Fatalf("replay = %d, %v", len(moved), err)
	}
	if got := recordAt(t, c.Addrs(), source, off+1); !bytes.Equal(got.key, m.Key) || !bytes.Equal(got.value, m.Value) {
		t.Fatal("replayed message differs from the original")
	}
}

// Kafka tells a null header value from an empty one; a dead letter and its
// replay keep the difference.
func TestEmptyHeaderValueIsNotNull(t *testing.T) {
	t.Parallel()
	h := newDLQHarness(t, false)
	ctx := testCtx(t, 60*time.Second)
	q := h.open(t)
	r := h.Record("acme", "v")
	r.Key, r.Headers = []byte{}, []dlq.Header{{Key: "tenant", Value: []byte{}}, {Key: "trace", Value: nil}}
	if err := q.Write(ctx, r); err != nil {
		t.Fatal(err)
	}
	recs, err := q.Peek(ctx, "acme", 0)
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
	if _, err := q.Replay(ctx, "acme", dlq.ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	got := recordAt(t, h.c.Addrs(), h.source, 0)
	var tenant, trace *dlq.Header
	for i := range got.headers {
		switch got.headers[i].Key {
		case "tenant":
			tenant = &got.headers[i]
		case "trace":
			trace = &got.headers[i]
		}
	}
	if tenant == nil || tenant.Value == nil || trace == nil || trace.Value != nil {
		t.Fatalf("replayed headers %#v: want tenant empty (not null) and trace null", got.headers)
	}
}

// Creating one tenant's DLQ topic is a network call; while it is slow,
// other tenants' dead letters still go through.
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
	sink, err := NewDLQ(c.Addrs(), source)
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

// tightTopic makes acme's DLQ topic beforehand, with a max.message.bytes
// of 4 KiB.
func tightTopic(t *testing.T, h *dlqHarness) string {
	t.Helper()
	topic := dlq.KafkaTopic(h.source, "acme")
	cl := &kafkago.Client{Addr: kafkago.TCP(h.c.Addrs()...)}
	if _, err := createTopicWith(testCtx(t, 30*time.Second), cl, topic, 1, -1, kafkago.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "4096"}); err != nil {
		t.Fatal(err)
	}
	return topic
}

// A record larger than its DLQ topic accepts, on a broker that refuses to
// raise the topic's limit, is ErrUnwritable; a DLQ that is down is not
// (the engine sets the first aside and retries the second).
func TestWriteUnwritableOnlyWhenItCannotFit(t *testing.T) {
	t.Parallel()
	h := newDLQHarness(t, false)
	ctx := testCtx(t, 60*time.Second)
	tightTopic(t, h)
	k := h.c.Kfake()
	k.ControlKey(kmsg.IncrementalAlterConfigs.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		k.KeepControl()
		r := req.(*kmsg.IncrementalAlterConfigsRequest)
		resp := r.ResponseKind().(*kmsg.IncrementalAlterConfigsResponse)
		for _, res := range r.Resources {
			rr := kmsg.NewIncrementalAlterConfigsResponseResource()
			rr.ResourceType, rr.ResourceName, rr.ErrorCode = res.ResourceType, res.ResourceName, kerr.PolicyViolation.Code
			resp.Resources = append(resp.Resources, rr)
		}
		return resp, nil, true
	})
	q := h.open(t)
	if err := q.Write(ctx, h.Record("acme", "fits")); err != nil {
		t.Fatalf("a small record: %v", err)
	}
	big := h.Record("acme", "")
	big.Value = make([]byte, 8192)
	err := q.Write(ctx, big)
	if !errors.Is(err, dlq.ErrUnwritable) {
		t.Fatalf("a record over a limit that may not be raised: %v, want ErrUnwritable", err)
	}
	t.Logf("unwritable: %v", err)

	h.c.Close()
	down, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := q.Write(down, h.Record("globex", "x")); err == nil || errors.Is(err, dlq.ErrUnwritable) {
		t.Fatalf("a DLQ that is down: %v, want a transient error (not ErrUnwritable)", err)
	}
}

// A DLQ topic whose limit is below a record is raised to fit it.
func TestWriteRaisesItsTopicsLimit(t *testing.T) {
	t.Parallel()
	h := newDLQHarness(t, false)
	ctx := testCtx(t, 60*time.Second)
	topic := tightTopic(t, h)
	big := h.Record("acme", "")
	big.Value = make([]byte, 8192)
	if err := h.open(t).Write(ctx, big); err != nil {
		t.Fatalf("a record over its topic's limit: %v", err)
	}
	if n, err := topicLimit(ctx, &kafkago.Client{Addr: kafkago.TCP(h.c.Addrs()...)}, topic); err != nil || n <= 8192 {
		t.Fatalf("topic limit after the write = %d, %v", n, err)
	}
}

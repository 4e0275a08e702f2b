package kafka

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
)

// batchDispatcher records what a fetcher delivers, slice by slice.
type batchDispatcher struct {
	mu     sync.Mutex
	slices [][]*consumer.Message
}

func (d *batchDispatcher) Assigned(consumer.Partition) {}
func (d *batchDispatcher) Revoked(consumer.Partition)  {}
func (d *batchDispatcher) Deliver(m *consumer.Message) { d.DeliverBatch([]*consumer.Message{m}) }
func (d *batchDispatcher) DeliverBatch(ms []*consumer.Message) {
	d.mu.Lock()
	d.slices = append(d.slices, ms)
	d.mu.Unlock()
}

func (d *batchDispatcher) all() []*consumer.Message {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*consumer.Message
	for _, s := range d.slices {
		out = append(out, s...)
	}
	return out
}

// testFetcher is a fetcher of partition p outside any group.
func testFetcher(t testing.TB, addrs []string, p consumer.Partition, opts ...SourceOption) *fetcher {
	t.Helper()
	src, err := NewSource(addrs, p.Topic, "unused", opts...)
	if err != nil {
		t.Fatal(err)
	}
	f := src.newFetcher(&partition{id: p, start: 0, done: -1})
	t.Cleanup(f.drop)
	return f
}

// fetchUntil fetches with f from offset until fn holds for what was
// delivered, and returns it and the next offset.
func fetchUntil(t testing.TB, f *fetcher, offset int64, fn func([]*consumer.Message) bool) ([]*consumer.Message, int64) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	d := &batchDispatcher{}
	for !fn(d.all()) {
		next, err := f.fetchOnce(ctx, offset, d)
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("fetch at %d: %v", offset, err)
			}
			t.Logf("fetch at %d: %v (retrying)", offset, err)
			time.Sleep(50 * time.Millisecond)
		}
		offset = next
	}
	return d.all(), offset
}

// sourceFetch reads the message at offset of p as the source does: its
// fetcher, record decoder and copies.
func sourceFetch(t testing.TB, addrs []string, p consumer.Partition, offset int64) *consumer.Message {
	t.Helper()
	ms, _ := fetchUntil(t, testFetcher(t, addrs, p), offset, func(ms []*consumer.Message) bool { return len(ms) > 0 })
	if ms[0].Offset != offset {
		t.Fatalf("fetch at %d delivered offset %d first", offset, ms[0].Offset)
	}
	return ms[0]
}

// produceWith writes msgs to partition 0 of topic with a Writer over tr.
func produceWith(t testing.TB, addrs []string, topic string, tr *kafkago.Transport, codec kafkago.Compression, msgs ...kafkago.Message) {
	t.Helper()
	w := &kafkago.Writer{
		Addr: kafkago.TCP(addrs...), Topic: topic, Compression: codec,
		RequiredAcks: kafkago.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 100,
	}
	if tr != nil {
		w.Transport = tr
	}
	defer w.Close()
	if err := w.WriteMessages(testCtx(t, 30*time.Second), msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func sameMessage(got *consumer.Message, want kafkago.Message) bool {
	if !sameBytes(got.Key, want.Key) || !sameBytes(got.Value, want.Value) || len(got.Headers) != len(want.Headers) {
		return false
	}
	for i, h := range got.Headers {
		if h.Key != want.Headers[i].Key || !sameBytes(h.Value, want.Headers[i].Value) {
			return false
		}
	}
	return true
}

// Batches compressed with each codec, as kafka-go's Writer produces them,
// reach the engine whole: keys, values (small and past the arena's
// largeValue) and headers, null and empty apart.
func TestSourceReadsEveryCodec(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	for _, codec := range []kafkago.Compression{kafkago.Gzip, kafkago.Snappy, kafkago.Lz4, kafkago.Zstd} {
		t.Run(codec.String(), func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t, 60*time.Second)
			topic := uniq("codec-" + codec.String())
			if err := createTopic(ctx, &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}, topic, 1, -1); err != nil {
				t.Fatal(err)
			}
			var sent []kafkago.Message
			for i := range 300 {
				m := kafkago.Message{
					Key:     []byte(fmt.Sprintf("tenant-%d", i%5)),
					Value:   bytes.Repeat([]byte(strconv.Itoa(i)), i%9*300),
					Headers: []kafkago.Header{{Key: "i", Value: []byte(strconv.Itoa(i))}, {Key: "empty", Value: []byte{}}, {Key: "null"}},
				}
				sent = append(sent, m)
			}
			produceWith(t, c.Addrs(), topic, nil, codec, sent...)

			// The batches are stored compressed, as produced.
			if got := storedCodec(t, c.Addrs(), topic); got != int16(codec) {
				t.Fatalf("fetched batch has codec %d, want %d", got, codec)
			}

			src, err := NewSource(c.Addrs(), topic, uniq("g"), fastOpts()...)
			if err != nil {
				t.Fatal(err)
			}
			col := newCollector(true)
			col.src = src
			var mu sync.Mutex
			got := map[int64]*consumer.Message{}
			col.onMsg = func(m *consumer.Message) {
				mu.Lock()
				got[m.Offset] = m
				mu.Unlock()
			}
			consumertest.StartSource(t, src, col)
			col.waitFor(t, ctx, "every message", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(got) == len(sent) // a rebalance may deliver some twice
			})
			mu.Lock()
			defer mu.Unlock()
			for i, want := range sent {
				if m := got[int64(i)]; m == nil || !sameMessage(m, want) {
					t.Fatalf("offset %d: got %+v, want %+v", i, m, want)
				}
			}
		})
	}
}

// storedCodec fetches the first record batch of topic/0 and returns its
// compression codec.
func storedCodec(t testing.TB, addrs []string, topic string) int16 {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	f := testFetcher(t, addrs, consumer.Partition{Topic: topic})
	if err := f.connect(ctx); err != nil {
		t.Fatal(err)
	}
	batches, _, err := f.req.Send(ctx, f.conn, f.version, 0, f.epoch)
	if err != nil {
		t.Fatal(err)
	}
	defer f.conn.ReleaseBuf()
	var b kmsg.RecordBatch
	if err := b.ReadFrom(batches); err != nil {
		t.Fatal(err)
	}
	return b.Attributes & 0x07
}

// Keys, values and header values keep null apart from empty end to end,
// as franz-go produces them.
func TestFetchKeepsNullApartFromEmpty(t *testing.T) {
	t.Parallel()
	topic := uniq("nulls")
	c := startStrictCluster(t, kfake.SeedTopics(1, topic))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := []*kgo.Record{
		{Key: nil, Value: nil},
		{Key: []byte{}, Value: []byte{}, Headers: []kgo.RecordHeader{{Key: "null"}, {Key: "empty", Value: []byte{}}}},
		{Key: []byte("k"), Value: []byte("v"), Headers: []kgo.RecordHeader{{Key: "", Value: []byte("x")}}},
	}
	if err := cl.ProduceSync(testCtx(t, 30*time.Second), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	ms, next := fetchUntil(t, testFetcher(t, c.Addrs(), consumer.Partition{Topic: topic}), 0, func(ms []*consumer.Message) bool { return len(ms) == 3 })
	for i, r := range recs {
		want := kafkago.Message{Key: r.Key, Value: r.Value}
		for _, h := range r.Headers {
			want.Headers = append(want.Headers, kafkago.Header{Key: h.Key, Value: h.Value})
		}
		if !sameMessage(ms[i], want) {
			t.Errorf("record %d: got %+v, want %+v (null and empty apart)", i, ms[i], want)
		}
	}
	if next != 3 {
		t.Fatalf("next offset %d, want 3", next)
	}
}

// Transaction markers take offsets but are never delivered; reading
// uncommitted delivers an aborted transaction's records, and a fetch of
// markers alone moves the offset past them.
func TestFetchSkipsTransactionMarkers(t *testing.T) {
	t.Parallel()
	topic := uniq("txn")
	c := startStrictCluster(t, kfake.SeedTopics(1, topic))
	ctx := testCtx(t, 60*time.Second)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.DefaultProduceTopic(topic), kgo.TransactionalID(uniq("tx")))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i, commit := range []bool{true, false, true} {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for j := range 3 {
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(fmt.Sprintf("%d-%d", i, j))}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	// Offsets: 0-2, marker 3, 4-6 (aborted), marker 7, 8-10, marker 11.
	f := testFetcher(t, c.Addrs(), consumer.Partition{Topic: topic})
	ms, next := fetchUntil(t, f, 0, func(ms []*consumer.Message) bool { return len(ms) >= 9 })
	var offs []int64
	for _, m := range ms {
		offs = append(offs, m.Offset)
	}
	if want := []int64{0, 1, 2, 4, 5, 6, 8, 9, 10}; !slices.Equal(offs, want) || next != 12 {
		t.Fatalf("delivered offsets %v, next %d; want %v, 12", offs, next, want)
	}
	d := &batchDispatcher{}
	if next, err := f.fetchOnce(ctx, 11, d); err != nil || next != 12 || len(d.all()) != 0 {
		t.Fatalf("fetch of the last marker: next %d, %d messages, %v; want 12, 0", next, len(d.all()), err)
	}
}

// The fetcher follows its partition to a new leader, and to a new leader
// epoch on the same broker.
func TestFetchFollowsLeaderChange(t *testing.T) {
	t.Parallel()
	topic := uniq("moving")
	c := startStrictCluster(t, kfake.NumBrokers(3), kfake.SeedTopics(1, topic))
	ctx := testCtx(t, 60*time.Second)
	k := c.Kfake()
	// kgo finds the new leader at once (kafka-go's default transport
	// caches metadata for 6s).
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	f := testFetcher(t, c.Addrs(), consumer.Partition{Topic: topic})
	next := int64(0)
	fetchN := func(n int, want error) {
		t.Helper()
		for i := range n {
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(fmt.Sprint(next, "-", i))}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if want != nil {
			_, err := f.fetchOnce(ctx, next, &batchDispatcher{})
			if !errors.Is(err, want) || f.conn != nil {
				t.Fatalf("fetch after the move: %v (connection kept: %v); want %v, connection closed", err, f.conn != nil, want)
			}
		}
		_, next = fetchUntil(t, f, next, func(ms []*consumer.Message) bool { return len(ms) == n })
		if leader := k.LeaderFor(topic, 0); f.conn.Addr() != c.Addrs()[leader] {
			t.Fatalf("fetching from %s, the leader is %s", f.conn.Addr(), c.Addrs()[leader])
		}
	}
	fetchN(5, nil)
	old := k.LeaderFor(topic, 0)
	if err := k.MoveTopicPartition(topic, 0, (old+1)%3); err != nil {
		t.Fatal(err)
	}
	fetchN(5, kafkago.NotLeaderForPartition)
	if err := k.MoveTopicPartition(topic, 0, (old+1)%3); err != nil { // same leader, next epoch
		t.Fatal(err)
	}
	fetchN(5, kafkago.FencedLeaderEpoch)
	if next != 15 {
		t.Fatalf("next offset %d, want 15", next)
	}
}

// A connection the broker drops in the middle of a fetch is redialled on
// the next try; a fetch held by a hung broker ends as soon as ctx does.
func TestFetchConnectionDroppedAndCancelled(t *testing.T) {
	t.Parallel()
	topic := uniq("drop")
	c := startStrictCluster(t, kfake.SeedTopics(1, topic))
	k := c.Kfake()
	produce(t, c.Addrs(), topic, msgs("a", 1, 3)...)
	f := testFetcher(t, c.Addrs(), consumer.Partition{Topic: topic})
	_, next := fetchUntil(t, f, 0, func(ms []*consumer.Message) bool { return len(ms) == 3 })

	k.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		k.SleepControl(func() { time.Sleep(100 * time.Millisecond) })
		return nil, errors.New("dropped"), true // closes the connection
	})
	if _, err := f.fetchOnce(testCtx(t, 30*time.Second), next, &batchDispatcher{}); err == nil || f.conn != nil {
		t.Fatalf("fetch on a dropped connection: %v (connection kept: %v)", err, f.conn != nil)
	}
	produce(t, c.Addrs(), topic, msgs("b", 1, 2)...)
	ms, next := fetchUntil(t, f, next, func(ms []*consumer.Message) bool { return len(ms) == 2 })
	if string(ms[0].Value) != "b-0-0" || next != 5 {
		t.Fatalf("after the redial: %q first, next %d", ms[0].Value, next)
	}

	release := make(chan struct{})
	defer close(release)
	k.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		k.SleepControl(func() { <-release })
		return nil, errors.New("released"), true
	})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, err := f.fetchOnce(ctx, next, &batchDispatcher{})
	if err == nil || !errors.Is(err, context.Canceled) || time.Since(start) > 5*time.Second {
		t.Fatalf("fetch held by the broker, ctx cancelled after 200ms: %v after %v", err, time.Since(start))
	}
}

// SASL PLAIN: the source consumes with the right password; with a wrong
// one its fetcher fails with the terminal error the group join gives.
func TestFetchAuthenticatesWithSASL(t *testing.T) {
	t.Parallel()
	topic := uniq("sasl")
	c := startStrictCluster(t, kfake.SeedTopics(1, topic), kfake.EnableSASL(), kfake.Superuser("PLAIN", "admin", "secret"))
	good := plain.Mechanism{Username: "admin", Password: "secret"}
	produceWith(t, c.Addrs(), topic, &kafkago.Transport{SASL: good}, 0, msgs("s", 1, 10)...)

	src, err := NewSource(c.Addrs(), topic, uniq("g"), fastOpts(WithDialer(&kafkago.Dialer{Timeout: 5 * time.Second, SASLMechanism: good}))...)
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(true)
	col.src = src
	consumertest.StartSource(t, src, col)
	col.waitFor(t, testCtx(t, 30*time.Second), "every message", func() bool { return len(col.seen) == 10 })

	bad := &kafkago.Dialer{Timeout: 5 * time.Second, SASLMechanism: plain.Mechanism{Username: "admin", Password: "wrong"}}
	f := testFetcher(t, c.Addrs(), consumer.Partition{Topic: topic}, WithDialer(bad))
	_, err = f.fetchOnce(testCtx(t, 30*time.Second), 0, &batchDispatcher{})
	if !errors.Is(err, kafkago.SASLAuthenticationFailed) || !terminal(err) {
		t.Fatalf("fetch with a wrong password: %v; want terminal SASLAuthenticationFailed", err)
	}
}

// The fetcher connects with the dialer's TLS config, taking the server
// name from the broker's host (the broker speaks only TLS).
func TestFetchConnectsWithTLS(t *testing.T) {
	t.Parallel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	topic := uniq("tls")
	c := startStrictCluster(t, kfake.SeedTopics(1, topic), kfake.TLS(&tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}))
	client := &tls.Config{RootCAs: roots}
	produceWith(t, c.Addrs(), topic, &kafkago.Transport{TLS: client}, 0, msgs("t", 1, 4)...)
	f := testFetcher(t, c.Addrs(), consumer.Partition{Topic: topic}, WithDialer(&kafkago.Dialer{Timeout: 5 * time.Second, TLS: client}))
	ms, _ := fetchUntil(t, f, 0, func(ms []*consumer.Message) bool { return len(ms) == 4 })
	if string(ms[3].Value) != "t-0-3" {
		t.Fatalf("last message %q", ms[3].Value)
	}
}

// The fetcher uses the highest Fetch version in [4, 11] the broker offers,
// and refuses a broker older than Kafka 0.11.
func TestFetchUsesTheHighestVersionFrom4To11(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		max  *kversion.Versions
		want int16 // 0: refused
	}{
		{"0.10.2", kversion.V0_10_2(), 0},
		{"0.11.0", kversion.V0_11_0(), 5},
		{"2.4.0", kversion.V2_4_0(), 11},
		{"latest", nil, 11},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			topic := uniq("v")
			opts := []kfake.Opt{kfake.SeedTopics(1, topic)}
			if tt.max != nil {
				opts = append(opts, kfake.MaxVersions(tt.max))
			}
			c := startStrictCluster(t, opts...)
			f := testFetcher(t, c.Addrs(), consumer.Partition{Topic: topic})
			if tt.want == 0 {
				_, err := f.fetchOnce(testCtx(t, 30*time.Second), 0, &batchDispatcher{})
				if err == nil || !strings.Contains(err.Error(), "needs v4") {
					t.Fatalf("fetch from a Kafka %s broker: %v; want a refusal", tt.name, err)
				}
				return
			}
			produce(t, c.Addrs(), topic, msgs("v", 1, 3)...)
			fetchUntil(t, f, 0, func(ms []*consumer.Message) bool { return len(ms) == 3 })
			if f.version != tt.want {
				t.Fatalf("Fetch v%d, want v%d", f.version, tt.want)
			}
		})
	}
}

// A fetcher keeps no response buffer between fetches (a wide assignment
// would otherwise hold one of up to MaxBytes per partition), and what it
// delivered stays intact after the pooled buffer is reused by other
// fetches.
func TestFetchKeepsNoResponseBuffer(t *testing.T) {
	t.Parallel()
	topic := uniq("bufs")
	c := startStrictCluster(t, kfake.SeedTopics(2, topic))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for i := range 200 {
		recs = append(recs, &kgo.Record{Partition: int32(i % 2), Value: []byte(fmt.Sprintf("value-%03d-%s", i, strings.Repeat("x", 200)))})
	}
	if err := cl.ProduceSync(testCtx(t, 30*time.Second), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	f0 := testFetcher(t, c.Addrs(), consumer.Partition{Topic: topic, ID: 0})
	first, _ := fetchUntil(t, f0, 0, func(ms []*consumer.Message) bool { return len(ms) == 100 })
	if f0.conn == nil || f0.conn.Buffered() {
		t.Fatal("after a fetch the connection holds a response buffer")
	}
	f1 := testFetcher(t, c.Addrs(), consumer.Partition{Topic: topic, ID: 1})
	for range 3 { // other fetches reuse the pooled buffer
		fetchUntil(t, f1, 0, func(ms []*consumer.Message) bool { return len(ms) == 100 })
	}
	for i, m := range first {
		if want := fmt.Sprintf("value-%03d-", 2*i); !strings.HasPrefix(string(m.Value), want) {
			t.Fatalf("message %d of partition 0 reads %.12q after the buffer was reused, want %q", i, m.Value, want)
		}
	}
}

// pausingCollector pauses its partition after every delivered slice and
// lets the test resume it: the source must go on from the response it
// already holds, not fetch the same records again.
type pausingCollector struct {
	*collector
	paused chan consumer.Partition
}

func (c pausingCollector) DeliverBatch(ms []*consumer.Message) {
	c.collector.DeliverBatch(ms)
	c.src.Pause(ms[0].Partition)
	c.paused <- ms[0].Partition
}

// A partition the engine pauses mid-response goes on, once resumed, from
// the rest of that response (its current batch, even a compressed one, and
// the batches after it): every record once, in order, from one Fetch.
func TestResumeGoesOnFromTheResponse(t *testing.T) {
	t.Parallel()
	topic := uniq("rest")
	c := startCluster(t, kfake.SeedTopics(1, topic))
	// Three batches of 300 records, the middle one compressed: slices of
	// deliverSlice cut each of them mid-batch.
	const per, batches = 300, 3
	for b := range batches {
		w := &kafkago.Writer{Addr: kafkago.TCP(c.Addrs()...), Topic: topic, RequiredAcks: kafkago.RequireAll, BatchTimeout: time.Millisecond, BatchSize: per}
		if b == 1 {
			w.Compression = kafkago.Snappy
		}
		var ms []kafkago.Message
		for i := range per {
			ms = append(ms, kafkago.Message{Value: []byte(fmt.Sprintf("v-%d-%d", b, i))})
		}
		if err := w.WriteMessages(testCtx(t, 30*time.Second), ms...); err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
	var fetches atomic.Int64
	c.Kfake().ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		fetches.Add(1)
		return nil, nil, false
	})
	src, err := NewSource(c.Addrs(), topic, uniq("g"), fastOpts(WithMaxBytes(1<<20))...)
	if err != nil {
		t.Fatal(err)
	}
	col := pausingCollector{collector: newCollector(true), paused: make(chan consumer.Partition, 64)}
	col.src = src
	consumertest.StartSource(t, src, col)
	ctx := testCtx(t, 60*time.Second)
	const total = per * batches
	var slices int
	for {
		var p consumer.Partition
		select {
		case p = <-col.paused:
		case <-ctx.Done():
			t.Fatalf("%d slices delivered, then nothing", slices)
		}
		slices++
		col.mu.Lock()
		n := len(col.byPart[0])
		col.mu.Unlock()
		if n == total {
			break
		}
		src.Resume(p)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	for i, off := range col.byPart[0] {
		if off != int64(i) {
			t.Fatalf("delivery %d has offset %d: want every offset once, in order", i, off)
		}
	}
	for b := range batches {
		for i := range per {
			if v := fmt.Sprintf("v-%d-%d", b, i); col.seen[v] != 1 {
				t.Fatalf("%s delivered %d times", v, col.seen[v])
			}
		}
	}
	if want := (total + deliverSlice - 1) / deliverSlice; slices < want {
		t.Fatalf("%d slices, want at least %d (deliverSlice %d): the test's pauses did not happen", slices, want, deliverSlice)
	}
	// One Fetch holds all 900 records (about 30 KB of 1 MiB); a source that
	// fetched again on each resume made one per slice.
	if n := fetches.Load(); n > 2 {
		t.Fatalf("%d Fetch requests for %d slices: a resume fetched again what the last response held", n, slices)
	}
}

package kafka

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
)

// recordOffset gives every test record a source offset of its own, so that
// records are distinct dead letters (copies share their ID).
var recordOffset atomic.Int64

func record(source, tenant string, reason dlq.Reason, value string, errText string) *dlq.Record {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	return &dlq.Record{
		Tenant:       tenant,
		Key:          []byte("key-" + value),
		Value:        []byte(value),
		Headers:      []dlq.Header{{Key: "trace", Value: []byte("t-" + value)}, {Key: dlq.HeaderAttempts, Value: []byte("99")}},
		Source:       source,
		Partition:    0,
		Offset:       recordOffset.Add(1),
		Group:        "orders-group",
		Attempts:     3,
		FirstFailure: t0,
		LastFailure:  t0.Add(time.Second),
		Error:        errText,
		ErrorType:    "*errors.errorString",
		Reason:       reason,
	}
}

func TestNewSinkAndInspectorValidate(t *testing.T) {
	t.Parallel()
	ok := []string{"127.0.0.1:9092"}
	bad := [][]SinkOption{
		{nil}, {SinkDialer(nil)}, {SinkSharedTopic("a b")}, {SinkPartitions(0)},
		{SinkReplication(0)}, {CursorGroup("")},
	}
	for i, opts := range bad {
		if _, err := NewSink(ok, opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("case %d: NewSink err = %v, want ErrInvalidOption", i, err)
		}
		if _, err := NewInspector(ok, "orders", opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("case %d: NewInspector err = %v, want ErrInvalidOption", i, err)
		}
	}
	if _, err := NewSink(nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("NewSink without brokers: %v", err)
	}
	if _, err := NewInspector(ok, ""); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("NewInspector without source: %v", err)
	}
}

// The inspector lists, peeks, replays and purges per tenant, in both the
// per-tenant-topic and the shared-topic layouts.
func TestInspector(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"per-tenant", "shared"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			c := startCluster(t)
			source := uniq("orders")
			var opts []SinkOption
			if mode == "shared" {
				opts = append(opts, SinkSharedTopic(source+"-dlq"), SinkPartitions(3))
			}
			ctx := testCtx(t, 60*time.Second)
			cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
			if err := createTopic(ctx, cl, source, 2, -1); err != nil {
				t.Fatal(err)
			}
			sink, err := NewSink(c.Addrs(), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer sink.Close()
			in, err := NewInspector(c.Addrs(), source, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()

			long := strings.Repeat("very-long-tenant-", 20)
			hostile := "acme.*>/x"
			writes := []*dlq.Record{
				record(source, "acme", dlq.ReasonPermanent, "a1", "bad json"),
				record(source, "acme", dlq.ReasonPermanent, "a2", "bad json"),
				record(source, "acme", dlq.ReasonExhausted, "a3", "timeout"),
				record(source, hostile, dlq.ReasonPoison, "h1", "boom"),
				record(source, "", dlq.ReasonNoTenant, "n1", "no tenant"),
				record(source, long, dlq.ReasonPermanent, "l1", "too long"),
			}
			for _, r := range writes {
				if err := sink.Write(ctx, r); err != nil {
					t.Fatalf("write %s: %v", r.Value, err)
				}
			}

			sums, err := in.Tenants(ctx)
			if err != nil {
				t.Fatal(err)
			}
			counts := map[string]int{}
			for _, s := range sums {
				counts[s.Tenant] = s.Count
				if s.Token != dlq.TenantToken(s.Tenant) {
					t.Errorf("tenant %q token %q, want %q", s.Tenant, s.Token, dlq.TenantToken(s.Tenant))
				}
				if s.Tenant == "acme" && (s.Reason != dlq.ReasonPermanent || s.LastError != "timeout" || s.Oldest.After(s.Newest)) {
					t.Errorf("acme summary = %+v", s)
				}
			}
			want := map[string]int{"acme": 3, hostile: 1, "": 1, long: 1}
			if len(counts) != len(want) {
				t.Fatalf("tenants = %v, want %v", counts, want)
			}
			for k, n := range want {
				if counts[k] != n {
					t.Fatalf("tenants = %v, want %v", counts, want)
				}
			}

			peek, err := in.Peek(ctx, "acme", 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(peek) != 2 || string(peek[0].Value) != "a1" || string(peek[1].Value) != "a2" {
				t.Fatalf("peek = %v", values(peek))
			}
			p0 := peek[0]
			if string(p0.Key) != "key-a1" || p0.Tenant != "acme" || p0.Group != "orders-group" || p0.Attempts != 3 || p0.Source != source || p0.Offset < 1 {
				t.Fatalf("peeked record = %+v", p0)
			}
			if len(p0.Headers) != 1 || p0.Headers[0].Key != "trace" || string(p0.Headers[0].Value) != "t-a1" {
				t.Fatalf("original headers not preserved (stale ringfence- ones must be replaced): %+v", p0.Headers)
			}
			if p0.Time.IsZero() {
				t.Fatal("peeked record has no DLQ time")
			}

			dry, err := in.Replay(ctx, "acme", dlq.ReplayOptions{Limit: 2, DryRun: true})
			if err != nil || len(dry) != 2 {
				t.Fatalf("dry run = %d, %v", len(dry), err)
			}
			if all, _ := in.Peek(ctx, "acme", 0); len(all) != 3 {
				t.Fatalf("dry run changed the DLQ: %d left", len(all))
			}
			moved, err := in.Replay(ctx, "acme", dlq.ReplayOptions{Limit: 2})
			if err != nil || len(moved) != 2 {
				t.Fatalf("replay = %v, %v", values(moved), err)
			}
			left, err := in.Peek(ctx, "acme", 0)
			if err != nil || len(left) != 1 || string(left[0].Value) != "a3" {
				t.Fatalf("after replay left = %v, %v", values(left), err)
			}
			replayed := readAll(t, c.Addrs(), source, 0, 2)
			if len(replayed) != 2 || string(replayed[0].Value) != "a1" || string(replayed[1].Value) != "a2" {
				t.Fatalf("source got %d replayed messages", len(replayed))
			}
			if got := dlq.RedriveCount(fromKafkaHeaders(replayed[0].Headers)); got != 1 {
				t.Fatalf("replayed redrive = %d, want 1", got)
			}
			if string(replayed[0].Key) != "key-a1" || header(replayed[0].Headers, "trace") != "t-a1" {
				t.Fatalf("replayed message lost its key or headers: %+v", replayed[0])
			}

			n, err := in.Purge(ctx, "acme")
			if err != nil || n != 1 {
				t.Fatalf("purge = %d, %v", n, err)
			}
			if n, err := in.Purge(ctx, "acme"); err != nil || n != 0 {
				t.Fatalf("second purge = %d, %v", n, err)
			}
			// Other tenants are untouched, even in a shared topic.
			if h, err := in.Peek(ctx, hostile, 0); err != nil || len(h) != 1 {
				t.Fatalf("hostile tenant after acme's purge: %v, %v", values(h), err)
			}
			if err := sink.Write(ctx, record(source, "acme", dlq.ReasonPermanent, "a4", "later")); err != nil {
				t.Fatal(err)
			}
			if later, err := in.Peek(ctx, "acme", 0); err != nil || len(later) != 1 || string(later[0].Value) != "a4" {
				t.Fatalf("after purge and a new dead letter: %v, %v", values(later), err)
			}
			if none, err := in.Peek(ctx, "nobody", 0); err != nil || len(none) != 0 {
				t.Fatalf("unknown tenant: %v, %v", values(none), err)
			}
		})
	}
}

func values(rs []dlq.Record) []string {
	var out []string
	for _, r := range rs {
		out = append(out, string(r.Value))
	}
	return out
}

func header(hs []kafkago.Header, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// readAll reads n messages of topic/partition from the start.
func readAll(t testing.TB, addrs []string, topic string, partition, n int) []kafkago.Message {
	t.Helper()
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: addrs, Topic: topic, Partition: partition, MaxWait: 50 * time.Millisecond})
	defer r.Close()
	ctx := testCtx(t, 20*time.Second)
	var out []kafkago.Message
	for len(out) < n {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read %s/%d: %v (got %d of %d)", topic, partition, err, len(out), n)
		}
		out = append(out, m)
	}
	return out
}

// kcatPath finds kcat (Debian's kafkacat package). Without it the interop
// test skips locally and fails in CI.
func kcatPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"kcat", "kafkacat"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("kcat not found; CI must install Debian's kafkacat package")
	}
	t.Skip("kcat not found: install it with `apt-get install kafkacat` to run the interop test")
	return ""
}

// kcat, a librdkafka client, reads our DLQ topic and its ringfence-
// headers, and messages it produces with a tenant header are consumed with
// that tenant.
func TestKcatInterop(t *testing.T) {
	t.Parallel()
	kcat := kcatPath(t)
	c := startCluster(t)
	addr := c.Addrs()[0]
	ctx := testCtx(t, 60*time.Second)
	source := uniq("orders")
	sink, err := NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	rec := record(source, "acme", dlq.ReasonPermanent, "order-42", "bad json")
	if err := sink.Write(ctx, rec); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, kcat, "-b", addr, "-C", "-t", sink.Topic(rec), "-e", "-q", "-f", "%h %s\n").CombinedOutput()
	if err != nil {
		t.Fatalf("kcat consume: %v\n%s", err, out)
	}
	line := strings.TrimSpace(string(out))
	t.Logf("kcat: %s", line)
	for _, want := range []string{"ringfence-tenant=acme", "ringfence-reason=permanent", "ringfence-source=" + source, "ringfence-attempts=3", "trace=t-order-42", "order-42"} {
		if !strings.Contains(line, want) {
			t.Fatalf("kcat output lacks %q:\n%s", want, line)
		}
	}

	// kcat -> our source.
	topic := uniq("kcat-in")
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	if err := createTopic(ctx, cl, topic, 1, -1); err != nil {
		t.Fatal(err)
	}
	prod := exec.CommandContext(ctx, kcat, "-b", addr, "-P", "-t", topic, "-H", "tenant=acme", "-k", "k1")
	prod.Stdin = bytes.NewBufferString("hello-from-kcat\n")
	if out, err := prod.CombinedOutput(); err != nil {
		t.Fatalf("kcat produce: %v\n%s", err, out)
	}
	src, err := NewSource(c.Addrs(), topic, uniq("g"), fastOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(true)
	col.src = src
	tenants := make(chan string, 1)
	col.onMsg = func(m *consumer.Message) {
		tn, err := consumer.FromHeader("tenant")(m)
		if err != nil {
			tn = "error: " + err.Error()
		}
		select {
		case tenants <- tn:
		default:
		}
	}
	consumertest.StartSource(t, src, col)
	col.waitFor(t, ctx, "the kcat message", func() bool { return col.seen["hello-from-kcat"] == 1 })
	if tn := <-tenants; tn != "acme" {
		t.Fatalf("kcat message consumed as tenant %q, want acme", tn)
	}
}

// With DeleteDrained, Purge deletes the drained topic, and a topic of the
// same name made later is read from its start.
func TestInspectorDeleteDrained(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := testCtx(t, 60*time.Second)
	source := uniq("orders")
	sink, err := NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	in, err := NewInspector(c.Addrs(), source, DeleteDrained())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	for _, v := range []string{"x1", "x2"} {
		if err := sink.Write(ctx, record(source, "acme", dlq.ReasonPermanent, v, "e")); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := in.Purge(ctx, "acme"); err != nil || n != 2 {
		t.Fatalf("purge = %d, %v", n, err)
	}
	topic := dlq.KafkaTopic(source, "acme")
	md, err := (&kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}).Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		t.Fatal(err)
	}
	if len(md.Topics) == 1 && md.Topics[0].Error == nil {
		t.Fatalf("drained topic %s still exists", topic)
	}
	sink2, err := NewSink(c.Addrs()) // a fresh sink creates the topic again
	if err != nil {
		t.Fatal(err)
	}
	defer sink2.Close()
	if err := sink2.Write(ctx, record(source, "acme", dlq.ReasonPermanent, "x3", "e")); err != nil {
		t.Fatal(err)
	}
	got, err := in.Peek(ctx, "acme", 0)
	if err != nil || len(got) != 1 || string(got[0].Value) != "x3" {
		t.Fatalf("after recreate peek = %v, %v", values(got), err)
	}
}

// An Inspector that has already talked to the cluster sees a tenant's
// dead-letter topic made afterwards by another client (kafka-go's Transport
// answers Metadata from a cache refreshed every 6s; a topic made since is
// unknown to it).
func TestInspectorSeesATopicMadeAfterIt(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := testCtx(t, 60*time.Second)
	source := uniq("orders")
	in, err := NewInspector(c.Addrs(), source)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if got, err := in.Peek(ctx, "acme", 0); err != nil || len(got) != 0 {
		t.Fatalf("before any dead letter: peek = %v, %v", values(got), err)
	}
	sink, err := NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if err := sink.Write(ctx, record(source, "acme", dlq.ReasonPermanent, "x1", "e")); err != nil {
		t.Fatal(err)
	}
	got, err := in.Peek(ctx, "acme", 0)
	if err != nil || len(got) != 1 || string(got[0].Value) != "x1" {
		t.Fatalf("after the sink made the topic: peek = %v, %v", values(got), err)
	}
	// The listing reads all topics' metadata, which kafka-go's transport
	// also caches: a second tenant's topic, made just now, must be listed.
	if err := sink.Write(ctx, record(source, "globex", dlq.ReasonPermanent, "y1", "e")); err != nil {
		t.Fatal(err)
	}
	sums, err := in.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range sums {
		names = append(names, s.Tenant)
	}
	if !slices.Equal(names, []string{"acme", "globex"}) {
		t.Fatalf("tenants listed = %q, want acme and globex", names)
	}
}

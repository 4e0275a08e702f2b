package kafka

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/kafkatest"
)

// dlqHarness runs consumertest.RunInspector on a source topic of its own
// in a cluster of its own.
type dlqHarness struct {
	c      *kafkatest.Cluster
	source string
	shared string // the DLQSharedTopic, if any
	opts   []DLQOption
	offset atomic.Int64
}

func newDLQHarness(t testing.TB, shared bool, opts ...kfake.Opt) *dlqHarness {
	t.Helper()
	h := &dlqHarness{c: startCluster(t, opts...), source: uniq("orders")}
	if shared {
		h.shared = h.source + "-dlq"
		h.opts = []DLQOption{DLQSharedTopic(h.shared), DLQPartitions(3)}
	}
	if err := createTopic(testCtx(t, 30*time.Second), &kafkago.Client{Addr: kafkago.TCP(h.c.Addrs()...)}, h.source, 1, -1); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *dlqHarness) open(t testing.TB) *DLQ {
	t.Helper()
	q, err := NewDLQ(h.c.Addrs(), h.source, h.opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	return q
}

func (h *dlqHarness) Open(t testing.TB) (dlq.Sink, dlq.Inspector) {
	q := h.open(t)
	return q, q
}

func (h *dlqHarness) Record(tenant, value string) *dlq.Record {
	return &dlq.Record{Tenant: tenant, Value: []byte(value), Source: h.source, Offset: h.offset.Add(1), Reason: dlq.ReasonPermanent}
}

func (h *dlqHarness) Replayed(t testing.TB) []consumertest.Replayed {
	var out []consumertest.Replayed
	for _, r := range readTopic(t, h.c.Addrs(), h.source) {
		out = append(out, consumertest.Replayed{Key: r.key, Value: r.value, Headers: r.headers})
	}
	return out
}

// OpenLive writes live records to the topic acme's dead letters would go
// to.
func (h *dlqHarness) OpenLive(t testing.TB) (dlq.Inspector, func(testing.TB), error) {
	t.Helper()
	live := h.shared
	if live == "" {
		live = dlq.KafkaTopic(h.source, "acme")
	}
	ctx := testCtx(t, 30*time.Second)
	if err := createTopic(ctx, &kafkago.Client{Addr: kafkago.TCP(h.c.Addrs()...)}, live, 1, -1); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := produceOne(ctx, h.c.Addrs(), live, kafkago.Message{Value: fmt.Appendf(nil, "live-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	intact := func(t testing.TB) {
		t.Helper()
		for _, group := range []string{DefaultDLQCursorGroup, DefaultDLQCursorGroup + "." + dlq.TenantToken("acme")} {
			if cur := committed(t, h.c.Addrs(), group, live, 1); cur[0] > 0 {
				t.Fatalf("the cursor %s on live data moved to %d", group, cur[0])
			}
		}
		recs := readTopic(t, h.c.Addrs(), live)
		if len(recs) != 3 || string(recs[0].value) != "live-0" || string(recs[2].value) != "live-2" {
			t.Fatalf("live data changed: %d records", len(recs))
		}
	}
	return h.open(t), intact, nil
}

func TestDLQConformance(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"per-tenant", "shared"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			consumertest.RunInspector(t, func(t testing.TB) consumertest.InspectorHarness { return newDLQHarness(t, mode == "shared") })
		})
	}
}

// readTopic reads every record of topic/0 with kafka-go's decoder, which
// keeps null apart from empty. It uses a transport of its own: kafka-go's
// default one caches metadata for 6s and may not know a topic made since.
func readTopic(t testing.TB, addrs []string, topic string) []*fetched {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafkago.Client{Addr: kafkago.TCP(addrs...), Transport: tr}
	_, end, err := partitionBounds(ctx, cl, topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []*fetched
	for offset := int64(0); offset < end; {
		resp, err := cl.Fetch(ctx, &kafkago.FetchRequest{Topic: topic, Offset: offset, MinBytes: 1, MaxBytes: 64 << 20, MaxWait: time.Second})
		if err == nil {
			err = resp.Error
		}
		if err != nil {
			t.Fatalf("fetch %s at %d: %v", topic, offset, err)
		}
		for {
			r, err := resp.Records.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("read %s at %d: %v", topic, offset, err)
			}
			if r.Offset < offset {
				continue
			}
			f := &fetched{offset: r.Offset, key: readAllBytes(t, r.Key), value: readAllBytes(t, r.Value), headers: fromKafkaHeaders(r.Headers)}
			out = append(out, f)
			offset = r.Offset + 1
		}
	}
	return out
}

func readAllBytes(t testing.TB, b kafkago.Bytes) []byte {
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

func TestNewDLQValidates(t *testing.T) {
	t.Parallel()
	ok := []string{"127.0.0.1:9092"}
	bad := [][]DLQOption{
		{nil}, {DLQDialer(nil)}, {DLQSharedTopic("a b")}, {DLQPartitions(0)},
		{DLQReplication(0)}, {DLQCursorGroup("")},
	}
	for i, opts := range bad {
		if _, err := NewDLQ(ok, "orders", opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("case %d: NewDLQ err = %v, want ErrInvalidOption", i, err)
		}
	}
	if _, err := NewDLQ(nil, "orders"); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("NewDLQ without brokers: %v", err)
	}
	if _, err := NewDLQ(ok, ""); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("NewDLQ without source: %v", err)
	}
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
	q, err := NewDLQ(c.Addrs(), source)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	rec := &dlq.Record{
		Tenant: "acme", Value: []byte("order-42"), Headers: []dlq.Header{{Key: "trace", Value: []byte("t-order-42")}},
		Source: source, Offset: 7, Attempts: 3, Error: "bad json", Reason: dlq.ReasonPermanent,
	}
	if err := q.Write(ctx, rec); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, kcat, "-b", addr, "-C", "-t", q.Topic("acme"), "-e", "-q", "-f", "%h %s\n").CombinedOutput()
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

// With DLQDeleteDrained, Purge deletes the drained topic, and a topic of
// the same name made later is read from its start.
func TestPurgeDeletesDrainedTopic(t *testing.T) {
	t.Parallel()
	h := newDLQHarness(t, false)
	h.opts = []DLQOption{DLQDeleteDrained()}
	ctx := testCtx(t, 60*time.Second)
	q := h.open(t)
	for _, v := range []string{"x1", "x2"} {
		if err := q.Write(ctx, h.Record("acme", v)); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := q.Purge(ctx, "acme"); err != nil || n != 2 {
		t.Fatalf("purge = %d, %v", n, err)
	}
	topic := q.Topic("acme")
	md, err := (&kafkago.Client{Addr: kafkago.TCP(h.c.Addrs()...)}).Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		t.Fatal(err)
	}
	if len(md.Topics) == 1 && md.Topics[0].Error == nil {
		t.Fatalf("drained topic %s still exists", topic)
	}
	// A fresh DLQ (another process) creates the topic again.
	if err := h.open(t).Write(ctx, h.Record("acme", "x3")); err != nil {
		t.Fatal(err)
	}
	got, err := q.Peek(ctx, "acme", 0)
	if err != nil || len(got) != 1 || string(got[0].Value) != "x3" {
		t.Fatalf("after the topic was made again, peek = %d records, %v", len(got), err)
	}
}

// A MarkerMoved record read from a DLQ decodes to IDs without blank ones,
// whatever its bytes.
func FuzzMovedLetters(f *testing.F) {
	f.Add("acme", []byte("orders/0/41\norders/1/7"))
	f.Add("", []byte("\n\n@0/3\n"))
	f.Fuzz(func(t *testing.T, token string, value []byte) {
		hs := []dlq.Header{{Key: dlq.HeaderMarker, Value: []byte(dlq.MarkerMoved)}, {Key: dlq.HeaderTenantToken, Value: []byte(token)}}
		for _, l := range movedLetters(hs, value) {
			if l.id == "" || strings.Contains(l.id, "\n") || l.token != token {
				t.Fatalf("letter %+v from %q", l, value)
			}
		}
	})
}

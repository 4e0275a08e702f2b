package kafka

// Tests of the Kafka spill log beyond the conformance suite (naming, topic
// settings, groups sharing a topic, read-ahead, size limits): one concern.

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/kafkatest"
)

// spillHarness gives consumertest.RunSpillLog spill logs over one kfake
// cluster: a fresh source topic (two partitions) and group per harness,
// and on each Open a new SpillLog over the same names.
type spillHarness struct {
	c      *kafkatest.Cluster
	source string
	group  string
}

func newSpillHarness(t testing.TB, c *kafkatest.Cluster) *spillHarness {
	t.Helper()
	h := &spillHarness{c: c, source: uniq("spillsrc"), group: uniq("g")}
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	if err := createTopic(testCtx(t, 10*time.Second), cl, h.source, 2, -1); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *spillHarness) Open(t testing.TB) consumer.SpillLog { return h.open(t) }

func (h *spillHarness) open(t testing.TB, opts ...SpillOption) *SpillLog {
	t.Helper()
	l, err := NewSpillLog(h.c.Addrs(), h.source, h.group, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func (h *spillHarness) Partition() consumer.Partition { return consumer.Partition{Topic: h.source} }
func (h *spillHarness) Other() consumer.Partition     { return consumer.Partition{Topic: h.source, ID: 1} }

func TestSpillLogConformance(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	consumertest.RunSpillLog(t, func(t testing.TB) consumertest.SpillLogHarness { return newSpillHarness(t, c) })
}

func TestNewSpillLogValidates(t *testing.T) {
	t.Parallel()
	ok := []string{"127.0.0.1:9092"}
	tests := []struct {
		name    string
		brokers []string
		source  string
		group   string
		opts    []SpillOption
	}{
		{"no brokers", nil, "t", "g", nil},
		{"broker without port", []string{"localhost"}, "t", "g", nil},
		{"bad source", ok, "a/b", "g", nil},
		{"source too long for long tenant keys", ok, strings.Repeat("s", MaxSpillSourceLen+1), "g", nil},
		{"empty group", ok, "t", "", nil},
		{"nil option", ok, "t", "g", []SpillOption{nil}},
		{"nil dialer", ok, "t", "g", []SpillOption{SpillDialer(nil)}},
		{"empty cursor group", ok, "t", "g", []SpillOption{SpillCursorGroup("")}},
		{"zero replication", ok, "t", "g", []SpillOption{SpillReplication(0)}},
		{"zero retention", ok, "t", "g", []SpillOption{SpillRetention(0)}},
		{"sub-millisecond retention", ok, "t", "g", []SpillOption{SpillRetention(time.Microsecond)}},
		{"zero fetch bytes", ok, "t", "g", []SpillOption{SpillFetchBytes(0)}},
		{"nil logger", ok, "t", "g", []SpillOption{SpillLogger(nil)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewSpillLog(tt.brokers, tt.source, tt.group, tt.opts...); !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("err = %v, want ErrInvalidOption", err)
			}
		})
	}
	l, err := NewSpillLog(ok, strings.Repeat("s", MaxSpillSourceLen), "billing")
	if err != nil {
		t.Fatal(err)
	}
	if got := l.CursorGroup(); got != "billing"+DefaultSpillGroupSuffix {
		t.Fatalf("cursor group %q", got)
	}
	for _, name := range []string{SpillTopic(l.Source()), SpillCursorTopic(l.Source())} {
		if err := validTopic(name); err != nil {
			t.Fatalf("the longest source's topic %s: %v", name, err)
		}
	}
}

// Tenant keys crafted to look like each other's tokens, and long keys that
// share a prefix, share the spill topic without ever reading each other's
// entries; Pending and Backlog name every full key from a fresh instance,
// and every record carries its full key.
func TestSpillHostileTenantKeys(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	h := newSpillHarness(t, c)
	ctx := testCtx(t, 60*time.Second)
	log := h.open(t)
	prefix := strings.Repeat("p", 300)
	hashedA := prefix + "-a"
	tenants := []string{
		"a.b", "a_2eb", // "a.b" encodes as "a_2eb"
		"x_5f", "x_", // "x_" encodes as "x_5f"
		hashedA, prefix + "-b", // same readable prefix, different hashes
		dlq.TenantToken(hashedA), // a key spelling hashedA's token
		"_none", "",              // "" is the no-tenant token "_none"
		"g/0/x", "a/b", // the cursor topic's key separator
	}
	p := h.Partition()
	for i, tn := range tenants {
		lane := consumer.SpillLane{Tenant: tn, Partition: p}
		m := &consumer.Message{Topic: h.source, Partition: p, Offset: int64(i), Value: []byte("v" + strconv.Itoa(i))}
		if err := log.Append(ctx, lane, []*consumer.Message{m}); err != nil {
			t.Fatalf("append for %q: %v", tn, err)
		}
	}
	// A fresh instance knows nothing: everything comes from the broker.
	lanes, err := h.open(t).Pending(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range lanes {
		got = append(got, l.Tenant)
	}
	want := slices.Clone(tenants)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("Pending = %q\nwant    %q", got, want)
	}
	backlog, err := h.open(t).Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, b := range backlog {
		if b.Total != 1 || b.Partitions[0] != 1 || b.Partitions[1] != 0 || b.Topic != SpillTopic(h.source) {
			t.Fatalf("backlog %+v, want one record in partition 0 of the spill topic", b)
		}
		got = append(got, b.Tenant)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("Backlog tenants = %q\nwant %q", got, want)
	}
	for _, l := range []*SpillLog{log, h.open(t)} {
		for i, tn := range tenants {
			lane := consumer.SpillLane{Tenant: tn, Partition: p}
			ms, err := l.Read(ctx, lane, -1, 10)
			if err != nil {
				t.Fatal(err)
			}
			if tn == "a.b" && l != log {
				if len(ms) != 0 {
					t.Fatalf("a.b reads %d entries past its cursor", len(ms))
				}
				continue
			}
			if len(ms) != 1 || string(ms[0].Value) != "v"+strconv.Itoa(i) {
				t.Fatalf("lane %q reads %d entries (%q...), want only its own", tn, len(ms), firstValue(ms))
			}
			// A commit of one lane settles only its own entry.
			if tn == "a.b" && l == log {
				if err := l.Commit(ctx, lane, ms[0].SpillPos+1); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if ls, err := h.open(t).Pending(ctx, p); err != nil || len(ls) != len(tenants)-1 || slices.Contains(ls, consumer.SpillLane{Tenant: "a.b", Partition: p}) {
		t.Fatalf("Pending after a.b's commit = %v, %v; want every lane but a.b", ls, err)
	}
	for i := range tenants {
		rec := recordAt(t, c.Addrs(), SpillTopic(h.source), int64(i))
		if v, ok := headerOf(rec.headers, SpillHeaderTenant); !ok || string(v) != tenants[i] {
			t.Fatalf("record %d carries tenant %q (%v), want %q", i, v, ok, tenants[i])
		}
	}
}

func firstValue(ms []*consumer.Message) string {
	if len(ms) == 0 {
		return ""
	}
	return string(ms[0].Value)
}

func headerOf(hs []dlq.Header, key string) ([]byte, bool) {
	for _, h := range hs {
		if h.Key == key {
			return h.Value, true
		}
	}
	return nil, false
}

// A message as large as the broker accepts is spilled and read back byte
// for byte, with its empty and null header values apart; three of them in
// one Append go out as two produce requests, each within the spill topic's
// limit (twice the source's plus 64 KiB).
func TestSpillMessageAtBrokerLimit(t *testing.T) {
	t.Parallel()
	const limit = 2 << 20
	c := startStrictCluster(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(limit)}))
	ctx := testCtx(t, 120*time.Second)
	h := newSpillHarness(t, c)
	tenant := "acme"
	hs := []kafkago.Header{{Key: "tenant", Value: []byte(tenant)}, {Key: "empty", Value: []byte{}}, {Key: "null", Value: nil}, {Key: SpillHeaderOffset, Value: []byte("not ours")}}
	m := kafkago.Message{Key: []byte("order-1"), Headers: hs}
	m.Value = bytes.Repeat([]byte("0123456789abcdef"), limit/16)[:atLimit(t, m.Key, m.Headers, limit)]
	m.Value[0], m.Value[len(m.Value)-1] = 0xff, 0x00
	var originals []*consumer.Message
	for range 3 {
		off, err := produceOne(ctx, c.Addrs(), h.source, m)
		if err != nil {
			t.Fatalf("the broker refuses a message at its limit: %v", err)
		}
		// Read it as the source does.
		originals = append(originals, sourceFetch(t, c.Addrs(), h.Partition(), off))
	}
	over := m
	over.Value = append(bytes.Clone(m.Value), 'x')
	if _, err := produceOne(ctx, c.Addrs(), h.source, over); !errors.Is(err, kafkago.MessageSizeTooLarge) {
		t.Fatalf("a message one byte over the limit: %v, want MessageSizeTooLarge (the test's message is not at the limit)", err)
	}
	log := h.open(t)
	lane := consumer.SpillLane{Tenant: tenant, Partition: h.Partition()}
	if err := log.Append(ctx, lane, originals); err != nil {
		t.Fatalf("spill three messages at the broker's limit: %v", err)
	}
	if s := log.Stats(); s.Produces != 2 || s.Appended != 3 {
		t.Fatalf("stats %+v: want 3 records in 2 produce requests", s)
	}
	got := readAllSpill(t, log, lane)
	if len(got) != 3 {
		t.Fatalf("read back %d entries, want 3", len(got))
	}
	for i, g := range got {
		o := originals[i]
		if !bytes.Equal(g.Value, o.Value) || !bytes.Equal(g.Key, o.Key) || g.Offset != o.Offset || g.Partition != o.Partition || !g.Time.Equal(o.Time) {
			t.Fatalf("entry %d differs: value %d bytes (want %d), key %q, %v@%d (want %v@%d)", i, len(g.Value), len(o.Value), g.Key, g.Partition, g.Offset, o.Partition, o.Offset)
		}
		if !sameHeaders(g.Headers, hs) {
			t.Fatalf("entry %d headers %q, want %q (null and empty apart)", i, g.Headers, hs)
		}
	}
}

// readAllSpill reads lane from its cursor to the end.
func readAllSpill(t testing.TB, log *SpillLog, lane consumer.SpillLane) []*consumer.Message {
	t.Helper()
	var out []*consumer.Message
	from := int64(-1)
	for range 100 {
		ms, err := log.Read(testCtx(t, 30*time.Second), lane, from, 8)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) == 0 {
			return out
		}
		out = append(out, ms...)
		from = ms[len(ms)-1].SpillPos + 1
	}
	t.Fatal("Read never reached the end")
	return nil
}

// Two consumer groups of one source share its spill topic; each reads back
// only its own records, and a group whose lane's records are all settled
// is not named by Pending whatever the other group left.
func TestSpillKeepsConsumerGroupsApart(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	ctx := testCtx(t, 60*time.Second)
	h := newSpillHarness(t, c)
	a := h.open(t)
	b, err := NewSpillLog(c.Addrs(), h.source, uniq("other"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p := h.Partition()
	lane := consumer.SpillLane{Tenant: "acme", Partition: p}
	msg := func(off int64, v string) *consumer.Message {
		return &consumer.Message{Topic: h.source, Partition: p, Offset: off, Value: []byte(v)}
	}
	if err := b.Append(ctx, lane, []*consumer.Message{msg(1, "b1"), msg(2, "b2")}); err != nil {
		t.Fatal(err)
	}
	if err := a.Append(ctx, lane, []*consumer.Message{msg(1, "a1")}); err != nil {
		t.Fatal(err)
	}
	if err := b.Append(ctx, lane, []*consumer.Message{msg(3, "b3")}); err != nil {
		t.Fatal(err)
	}
	values := func(ms []*consumer.Message) []string {
		var out []string
		for _, m := range ms {
			out = append(out, string(m.Value))
		}
		return out
	}
	if got := values(readAllSpill(t, a, lane)); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("group a reads %q", got)
	}
	if got := values(readAllSpill(t, b, lane)); !slices.Equal(got, []string{"b1", "b2", "b3"}) {
		t.Fatalf("group b reads %q", got)
	}
	// a settles its entry: only b's record remains past a's cursor.
	all := readAllSpill(t, a, lane)
	if err := a.Commit(ctx, lane, all[0].SpillPos+1); err != nil {
		t.Fatal(err)
	}
	if ls, err := a.Pending(ctx, p); err != nil || len(ls) != 0 {
		t.Fatalf("Pending with another group's records past the cursor = %v, %v; want none", ls, err)
	}
	if rest := readAllSpill(t, a, lane); len(rest) != 0 {
		t.Fatalf("group a reads %q past its cursor", values(rest))
	}
	if ls, err := b.Pending(ctx, p); err != nil || len(ls) != 1 {
		t.Fatalf("group b's Pending = %v, %v; want the lane", ls, err)
	}
}

// The spill topic is created like its source (partitions, a max.message.bytes
// with room for the headers, never compacted, the source's retention), the
// cursor topic compacted, and an existing spill topic that has fewer
// partitions than the source grows.
func TestSpillTopicIsMadeLikeItsSource(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	ctx := testCtx(t, 60*time.Second)
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	source := uniq("shaped")
	_, err := createTopicWith(ctx, cl, source, 3, -1,
		kafkago.ConfigEntry{ConfigName: "retention.ms", ConfigValue: "3600000"},
		kafkago.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "200000"})
	if err != nil {
		t.Fatal(err)
	}
	log, err := NewSpillLog(c.Addrs(), source, "g")
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	p2 := consumer.Partition{Topic: source, ID: 2}
	if err := log.Append(ctx, consumer.SpillLane{Tenant: "acme", Partition: p2}, []*consumer.Message{{Topic: source, Partition: p2, Offset: 7}}); err != nil {
		t.Fatal(err)
	}
	topic := SpillTopic(source)
	for name, want := range map[string]string{"retention.ms": "3600000", "cleanup.policy": "delete", "max.message.bytes": strconv.Itoa(spillLimit(200000))} {
		if got, _ := topicConfig(ctx, cl, topic, name); got != want {
			t.Fatalf("%s of %s = %q, want %q", name, topic, got, want)
		}
	}
	if err := log.Commit(ctx, consumer.SpillLane{Tenant: "acme", Partition: p2}, 1); err != nil {
		t.Fatal(err)
	}
	if got, _ := topicConfig(ctx, cl, SpillCursorTopic(source), "cleanup.policy"); got != "compact" {
		t.Fatalf("cleanup.policy of the cursor topic = %q, want compact", got)
	}
	live, err := liveTopics(ctx, kafkago.DefaultDialer, c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	if n := live[topic].partitions; n != 3 || live[SpillCursorTopic(source)].partitions != 3 {
		t.Fatalf("spill and cursor topics have %d and %d partitions, want the source's 3", n, live[SpillCursorTopic(source)].partitions)
	}

	// A spill topic with one partition grows to the source's count.
	source2 := uniq("shaped")
	if err := createTopic(ctx, cl, source2, 3, -1); err != nil {
		t.Fatal(err)
	}
	other := SpillTopic(source2)
	if err := createTopic(ctx, cl, other, 1, -1); err != nil {
		t.Fatal(err)
	}
	source = source2
	p2 = consumer.Partition{Topic: source, ID: 2}
	log2, err := NewSpillLog(c.Addrs(), source, "g", SpillRetention(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer log2.Close()
	// kafka-go's metadata cache learns of new partitions within its TTL
	// (6s); until then an append fails and the engine retries it.
	eventually(t, ctx, "an append to the grown spill topic", func() bool {
		return log2.Append(ctx, consumer.SpillLane{Tenant: "globex", Partition: p2}, []*consumer.Message{{Topic: source, Partition: p2, Offset: 8}}) == nil
	})
	if live, err = liveTopics(ctx, kafkago.DefaultDialer, c.Addrs()); err != nil || live[other].partitions != 3 {
		t.Fatalf("older spill topic has %d partitions (%v), want 3", live[other].partitions, err)
	}
}

// The spill record codec round-trips any message, its spill note
// included, and never panics on foreign headers.
func FuzzSpillRecord(f *testing.F) {
	f.Add([]byte("k"), []byte("v"), "h", []byte(""), int32(3), int64(42), "acme", int64(1700000000123456789))
	f.Add([]byte(nil), []byte(nil), SpillHeaderCount, []byte(nil), int32(0), int64(0), strings.Repeat("x", 300), int64(0))
	f.Fuzz(func(t *testing.T, key, value []byte, hk string, hv []byte, part int32, off int64, tenant string, nanos int64) {
		if part < 0 || off < 0 {
			return
		}
		m := &consumer.Message{
			Key: key, Value: value, Headers: []consumer.Header{{Key: hk, Value: hv}},
			Topic: "orders", Partition: consumer.Partition{Topic: "orders", ID: part}, Offset: off,
		}
		if nanos != 0 {
			m.Time = time.Unix(0, nanos)
		}
		m.SetSpillNote(hv) // any bytes: the codec carries a note without reading it
		r := encodeSpill(m, "g", hashedTenant(tenant), hashedTenant(tenant) != "")
		f := &fetched{offset: 9, key: r.key, value: r.value, headers: fromKafkaHeaders(r.headers)}
		sp, ok := decodeSpill(f, "orders")
		if !ok {
			t.Fatalf("own record not decoded: %q", r.headers)
		}
		g := sp.msg
		if !bytes.Equal(g.Key, key) || !bytes.Equal(g.Value, value) || g.Offset != off || g.Partition != m.Partition || !g.Time.Equal(m.Time) || g.SpillPos != 9 || !g.Refed {
			t.Fatalf("round trip: %+v, want %+v", g, m)
		}
		if !bytes.Equal(g.SpillNote(), m.SpillNote()) {
			t.Fatalf("note %q, want %q", g.SpillNote(), m.SpillNote())
		}
		if len(g.Headers) != 1 || g.Headers[0].Key != hk || !bytes.Equal(g.Headers[0].Value, hv) || (g.Headers[0].Value == nil) != (hv == nil) {
			t.Fatalf("headers %q, want [%q=%q]", g.Headers, hk, hv)
		}
		if sp.tenant != hashedTenant(tenant) || sp.group != "g" || sp.id != fmt.Sprintf("orders/%d/%d", part, off) {
			t.Fatalf("tenant %q group %q id %q", sp.tenant, sp.group, sp.id)
		}
		// Foreign header lists: cut anywhere, or a value changed.
		for i := range f.headers {
			_, _ = decodeSpill(&fetched{headers: f.headers[i:]}, "orders")
			hs := slices.Clone(f.headers)
			hs[i].Value = hv
			_, _ = decodeSpill(&fetched{headers: hs}, "orders")
		}
	})
}

// Pending over many lanes of one partition, half of them committed, names
// exactly the lanes with records past their cursor.
func TestSpillPendingFindsLanesAmongMany(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	ctx := testCtx(t, 60*time.Second)
	h := newSpillHarness(t, c)
	log := h.open(t)
	p := h.Partition()
	n := offsetsChunk + 6
	var want []string
	for i := range n {
		lane := consumer.SpillLane{Tenant: fmt.Sprintf("t%03d", i), Partition: p}
		if err := log.Append(ctx, lane, []*consumer.Message{{Topic: h.source, Partition: p, Offset: int64(i)}}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			ms, err := log.Read(ctx, lane, -1, 10)
			if err != nil || len(ms) != 1 {
				t.Fatalf("read %d entries of %s, %v", len(ms), lane.Tenant, err)
			}
			if err := log.Commit(ctx, lane, ms[0].SpillPos+1); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want = append(want, lane.Tenant)
	}
	lanes, err := h.open(t).Pending(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range lanes {
		got = append(got, l.Tenant)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("Pending named %d lanes %q, want %d %q", len(got), got, len(want), want)
	}
	if other, err := log.Pending(ctx, h.Other()); err != nil || len(other) != 0 {
		t.Fatalf("Pending of the other partition = %v, %v; want none", other, err)
	}
}

// In an old per-tenant spill topic, a lane whose next record lies behind
// many of another group's records is read in steps: each Read passes over
// what it can in its budget (here one fetch, of one record batch), says so
// with errSkipping, and the next Read goes on from there, from the cursor
// and from a position alike.
func TestSpillLegacyReadPassesOtherGroupsInSteps(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	ctx := testCtx(t, 60*time.Second)
	h := newSpillHarness(t, c)
	a := h.open(t, SpillFetchBytes(1))
	a.skipBudget = 0
	b := h.open(t)
	b.group = "other"
	p := h.Partition()
	lane := consumer.SpillLane{Tenant: "acme", Partition: p}
	a.legacy = map[consumer.SpillLane]bool{lane: true}
	b.legacy = map[consumer.SpillLane]bool{lane: true}
	for i := range 3 {
		if err := b.Append(ctx, lane, []*consumer.Message{{Topic: h.source, Partition: p, Offset: int64(i), Value: []byte("b")}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Append(ctx, lane, []*consumer.Message{{Topic: h.source, Partition: p, Offset: 9, Value: []byte("a")}}); err != nil {
		t.Fatal(err)
	}
	for _, from := range []int64{0, -1} {
		steps := 0
		var ms []*consumer.Message
		for ; steps < 10; steps++ {
			var err error
			ms, err = a.Read(ctx, lane, from, 5)
			if err == nil {
				break
			}
			if !errors.Is(err, errSkipping) {
				t.Fatalf("Read from %d: %v", from, err)
			}
		}
		if len(ms) != 1 || string(ms[0].Value) != "a" || ms[0].SpillPos != 3 {
			t.Fatalf("Read from %d after %d steps = %d entries (%q), want a's record at 3", from, steps, len(ms), firstValue(ms))
		}
		if steps != 3 {
			t.Fatalf("Read from %d took %d steps, want one per batch of b's records (3)", from, steps)
		}
	}
}

// A spill topic made by another process after this one's metadata cache
// was loaded is found by Pending, read and appended to at once (not only
// after kafka-go's 6s metadata refresh).
func TestSpillTopicMadeByAnotherProcess(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	ctx := testCtx(t, 60*time.Second)
	h := newSpillHarness(t, c)
	p := h.Partition()
	mine, theirs := h.open(t), h.open(t)
	if ls, err := mine.Pending(ctx, p); err != nil || len(ls) != 0 { // loads mine's cache
		t.Fatalf("Pending before any spill = %v, %v", ls, err)
	}
	lane := consumer.SpillLane{Tenant: "acme", Partition: p}
	if err := theirs.Append(ctx, lane, []*consumer.Message{{Topic: h.source, Partition: p, Offset: 1, Value: []byte("1")}}); err != nil {
		t.Fatal(err)
	}
	ls, err := mine.Pending(ctx, p)
	if err != nil || len(ls) != 1 || ls[0] != lane {
		t.Fatalf("Pending = %v, %v; want the lane", ls, err)
	}
	ms, err := mine.Read(ctx, lane, -1, 10)
	if err != nil || len(ms) != 1 {
		t.Fatalf("Read = %d entries, %v", len(ms), err)
	}
	if err := mine.Append(ctx, consumer.SpillLane{Tenant: "acme", Partition: h.Other()}, []*consumer.Message{{Topic: h.source, Partition: h.Other(), Offset: 2}}); err != nil {
		t.Fatalf("Append to a topic another process made: %v", err)
	}
	// And a topic this process never heard of, read without Pending.
	other := consumer.SpillLane{Tenant: "globex", Partition: p}
	if err := theirs.Append(ctx, other, []*consumer.Message{{Topic: h.source, Partition: p, Offset: 3, Value: []byte("3")}}); err != nil {
		t.Fatal(err)
	}
	if ms, err := mine.Read(ctx, other, -1, 10); err != nil || len(ms) != 1 {
		t.Fatalf("Read of a topic unknown to the cache = %d entries, %v", len(ms), err)
	}
}

// A lane with entries in an old per-tenant spill topic is named by Pending
// and drained from there first, in order; once drained, the next
// assignment reads its entries in the shared topic.
func TestSpillDrainsOldPerTenantTopics(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	ctx := testCtx(t, 60*time.Second)
	h := newSpillHarness(t, c)
	p := h.Partition()
	lane := consumer.SpillLane{Tenant: "acme", Partition: p}
	msg := func(off int64, v string) *consumer.Message {
		return &consumer.Message{Topic: h.source, Partition: p, Offset: off, Value: []byte(v)}
	}
	values := func(ms []*consumer.Message) []string {
		var out []string
		for _, m := range ms {
			out = append(out, string(m.Value))
		}
		return out
	}
	old := h.open(t)
	old.legacy = map[consumer.SpillLane]bool{lane: true} // as an earlier version wrote
	if err := old.Append(ctx, lane, []*consumer.Message{msg(1, "old1"), msg(2, "old2")}); err != nil {
		t.Fatal(err)
	}
	if err := h.open(t).Append(ctx, lane, []*consumer.Message{msg(3, "new3")}); err != nil {
		t.Fatal(err)
	}
	live, err := liveTopics(ctx, kafkago.DefaultDialer, c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := live[legacySpillTopic(h.source, "acme")]; !ok {
		t.Fatal("no old per-tenant topic was made")
	}

	n := h.open(t)
	ls, err := n.Pending(ctx, p)
	if err != nil || len(ls) != 1 || ls[0] != lane || n.Stats().Legacy != 1 {
		t.Fatalf("Pending = %v, %v (legacy lanes %d); want the lane once, draining its old topic", ls, err, n.Stats().Legacy)
	}
	got := readAllSpill(t, n, lane)
	if !slices.Equal(values(got), []string{"old1", "old2"}) {
		t.Fatalf("the old topic reads %q, want old1 old2", values(got))
	}
	if err := n.Commit(ctx, lane, got[len(got)-1].SpillPos+1); err != nil {
		t.Fatal(err)
	}
	backlog, err := h.open(t).Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(backlog) != 2 || backlog[0].Topic != SpillTopic(h.source) || backlog[0].Total != 1 ||
		backlog[1].Topic != legacySpillTopic(h.source, "acme") || backlog[1].Total != 0 || backlog[1].Tenant != "acme" {
		t.Fatalf("Backlog = %+v; want acme's entry in the shared topic, and its drained old topic", backlog)
	}

	next := h.open(t)
	ls, err = next.Pending(ctx, p)
	if err != nil || len(ls) != 1 || ls[0] != lane || next.Stats().Legacy != 0 {
		t.Fatalf("Pending after the drain = %v, %v (legacy lanes %d); want the lane, in the shared topic", ls, err, next.Stats().Legacy)
	}
	if got := values(readAllSpill(t, next, lane)); !slices.Equal(got, []string{"new3"}) {
		t.Fatalf("the shared topic reads %q, want new3", got)
	}
}

// A topic by the spill topic's name that is not one is refused: compacted,
// or holding records that are not spill records.
func TestSpillRefusesForeignTopic(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	ctx := testCtx(t, 60*time.Second)
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	for _, tt := range []struct {
		name    string
		configs []kafkago.ConfigEntry
		record  bool
	}{
		{"compacted", []kafkago.ConfigEntry{{ConfigName: "cleanup.policy", ConfigValue: "compact"}}, false},
		{"foreign records", nil, true},
	} {
		source := uniq("foreign")
		if err := createTopic(ctx, cl, source, 1, -1); err != nil {
			t.Fatal(err)
		}
		if _, err := createTopicWith(ctx, cl, SpillTopic(source), 1, -1, tt.configs...); err != nil {
			t.Fatal(err)
		}
		if tt.record {
			if err := produceRecords(ctx, cl, SpillTopic(source), 0, kafkago.Message{Value: []byte("someone else's")}); err != nil {
				t.Fatal(err)
			}
		}
		log, err := NewSpillLog(c.Addrs(), source, "g")
		if err != nil {
			t.Fatal(err)
		}
		p := consumer.Partition{Topic: source}
		err = log.Append(ctx, consumer.SpillLane{Tenant: "acme", Partition: p}, []*consumer.Message{{Topic: source, Partition: p}})
		if !errors.Is(err, ErrNotSpill) {
			t.Fatalf("%s: Append = %v, want ErrNotSpill", tt.name, err)
		}
		_ = log.Close()
	}
}

// The cursor record and the lane headers of the shared topic round-trip
// any tenant and never panic on foreign input.
func FuzzSpillLaneRecords(f *testing.F) {
	f.Add("acme", "g", int32(0), int64(7), []byte("12"), []byte("g/0/acme"))
	f.Add("", "a/b", int32(3), int64(0), []byte(nil), []byte("a_2fb/3/"))
	f.Add("x/1/y", "g", int32(1), int64(1<<62), []byte("-1"), []byte{0xff})
	f.Fuzz(func(t *testing.T, tenant, group string, part int32, next int64, value, key []byte) {
		if part < 0 || next < 0 {
			return
		}
		p := int(part)
		prefix := dlq.TenantToken(group) + "/" + strconv.Itoa(p) + "/"
		tn, n, ok := parseCursor(prefix, cursorKey(group, p, tenant), []byte(strconv.FormatInt(next, 10)))
		if !ok || tn != tenant || n != next {
			t.Fatalf("cursor of %q at %d read back as %q, %d, %v", tenant, next, tn, n, ok)
		}
		if tn, n, ok := parseCursor(prefix, cursorKey(group, p, tenant), nil); !ok || tn != tenant || n != -1 {
			t.Fatalf("tombstone of %q read back as %q, %d, %v", tenant, tn, n, ok)
		}
		if other := dlq.TenantToken(group) + "/" + strconv.Itoa(p+1) + "/"; other != prefix {
			if _, _, ok := parseCursor(other, cursorKey(group, p, tenant), nil); ok {
				t.Fatal("a cursor of partition p read as one of p+1")
			}
		}
		_, _, _ = parseCursor(prefix, key, value)

		s := &SpillLog{source: "orders", group: group}
		m := &consumer.Message{Topic: "orders", Partition: consumer.Partition{Topic: "orders", ID: part}, Value: value,
			Headers: []consumer.Header{{Key: SpillHeaderTenant, Value: key}, {Key: SpillHeaderGroup, Value: []byte("evil")}}}
		r := encodeSpill(m, group, tenant, true)
		hs := make([]wire.Header, len(r.headers))
		for i, h := range r.headers {
			hs[i] = wire.Header{Key: []byte(h.Key), Value: h.Value}
		}
		if got, ok := s.laneOf(hs); !ok || got != tenant {
			t.Fatalf("lane of a record of %q: %q, %v", tenant, got, ok)
		}
		for i := range hs {
			_, _ = s.laneOf(hs[i:])
			_, _ = s.laneOf(append(slices.Clone(hs[:i]), wire.Header{Key: key, Value: value}))
		}
	})
}

// Appends of many lanes of one partition at once share produce requests;
// each lane reads back its own records, in order.
func TestSpillConcurrentAppendsKeepEachLane(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	ctx := testCtx(t, 60*time.Second)
	h := newSpillHarness(t, c)
	log := h.open(t)
	p := h.Partition()
	const lanes, batches, per = 48, 4, 3
	if _, err := log.Pending(ctx, p); err != nil { // as the engine does on assignment
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, lanes)
	for i := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lane := consumer.SpillLane{Tenant: fmt.Sprintf("t%02d", i), Partition: p}
			for b := range batches {
				var ms []*consumer.Message
				for j := range per {
					n := b*per + j
					ms = append(ms, &consumer.Message{Topic: h.source, Partition: p, Offset: int64(n), Value: []byte(fmt.Sprintf("%s-%d", lane.Tenant, n))})
				}
				if err := log.Append(ctx, lane, ms); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := log.Stats()
	t.Logf("%d appends of %d lanes in %d produce requests (%d appends coalesced)", lanes*batches, lanes, st.Produces, st.Coalesced)
	if st.Appended != lanes*batches*per || st.Indexed != lanes*batches*per {
		t.Fatalf("stats %+v: want %d records appended and indexed", st, lanes*batches*per)
	}
	for _, l := range []*SpillLog{log, h.open(t)} {
		for i := range lanes {
			lane := consumer.SpillLane{Tenant: fmt.Sprintf("t%02d", i), Partition: p}
			got := readAllSpill(t, l, lane)
			if len(got) != batches*per {
				t.Fatalf("lane %s reads %d records, want %d", lane.Tenant, len(got), batches*per)
			}
			for n, m := range got {
				if want := fmt.Sprintf("%s-%d", lane.Tenant, n); string(m.Value) != want || m.Offset != int64(n) {
					t.Fatalf("lane %s record %d is %q (offset %d), want %q", lane.Tenant, n, m.Value, m.Offset, want)
				}
			}
		}
	}
}

// Lanes interleaved in one spill partition: committing one never loses
// another's entries across a restart, and the floor stays at the oldest
// unsettled record of any lane.
func TestSpillCommitOfOneLaneKeepsTheOthers(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	ctx := testCtx(t, 60*time.Second)
	h := newSpillHarness(t, c)
	log := h.open(t)
	p := h.Partition()
	a, b := consumer.SpillLane{Tenant: "a", Partition: p}, consumer.SpillLane{Tenant: "b", Partition: p}
	for i := range 4 {
		for _, lane := range []consumer.SpillLane{a, b} {
			m := &consumer.Message{Topic: h.source, Partition: p, Offset: int64(i), Value: []byte(fmt.Sprintf("%s%d", lane.Tenant, i))}
			if err := log.Append(ctx, lane, []*consumer.Message{m}); err != nil {
				t.Fatal(err)
			}
		}
	}
	values := func(ms []*consumer.Message) string {
		var out []string
		for _, m := range ms {
			out = append(out, string(m.Value))
		}
		return strings.Join(out, " ")
	}
	floor := func() int64 {
		t.Helper()
		cur, err := log.cursors(ctx, map[string][]int{SpillTopic(h.source): {0}})
		if err != nil {
			t.Fatal(err)
		}
		f, ok := cur[topicPart{SpillTopic(h.source), 0}]
		if !ok {
			return -1
		}
		return f
	}
	as := readAllSpill(t, log, a)
	if err := log.Commit(ctx, a, as[len(as)-1].SpillPos+1); err != nil {
		t.Fatal(err)
	}
	if f := floor(); f > 1 {
		t.Fatalf("floor %d after a's commit, want at most b's first record (1)", f)
	}
	fresh := h.open(t)
	if ls, err := fresh.Pending(ctx, p); err != nil || len(ls) != 1 || ls[0] != b {
		t.Fatalf("Pending after a's commit = %v, %v; want b", ls, err)
	}
	if got := values(readAllSpill(t, fresh, a)); got != "" {
		t.Fatalf("a reads %q after its commit", got)
	}
	bs := readAllSpill(t, fresh, b)
	if got := values(bs); got != "b0 b1 b2 b3" {
		t.Fatalf("b reads %q, want b0 b1 b2 b3", got)
	}
	if err := fresh.Commit(ctx, b, bs[1].SpillPos+1); err != nil {
		t.Fatal(err)
	}
	if f := floor(); f != bs[2].SpillPos {
		t.Fatalf("floor %d after b's commit of two, want b's third record (%d)", f, bs[2].SpillPos)
	}
	again := h.open(t)
	if ls, err := again.Pending(ctx, p); err != nil || len(ls) != 1 || ls[0] != b {
		t.Fatalf("Pending after b's partial commit = %v, %v; want b", ls, err)
	}
	if got := values(readAllSpill(t, again, b)); got != "b2 b3" {
		t.Fatalf("b reads %q after its partial commit, want b2 b3", got)
	}
	if got := values(readAllSpill(t, again, a)); got != "" {
		t.Fatalf("a reads %q", got)
	}
}

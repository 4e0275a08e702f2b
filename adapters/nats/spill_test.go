package nats

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/natstest"
)

// spillHarness runs consumertest.RunSpillLog on a fresh stream and durable
// of a shared server.
type spillHarness struct {
	f    *fixture
	opts []SpillOption
}

func (h *spillHarness) Open(t testing.TB) consumer.SpillLog { return h.f.spillLog(t, h.opts...) }
func (h *spillHarness) Partition() consumer.Partition       { return homePartition(h.f.stream, h.f.durable) }
func (h *spillHarness) Other() consumer.Partition {
	return consumer.Partition{Topic: "orders.eu-west", ID: 3}
}

func TestSpillLogConformance(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	consumertest.RunSpillLog(t, func(t testing.TB) consumertest.SpillLogHarness {
		return &spillHarness{f: newFixture(t, srv, 5*time.Second, 100)}
	})
}

// TestSpillLogConformanceOlderServer runs the suite as on a server (or
// stream) without atomic batches and direct gets: appends one record at a
// time, reads one record per request from the stream leader.
func TestSpillLogConformanceOlderServer(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	consumertest.RunSpillLog(t, func(t testing.TB) consumertest.SpillLogHarness {
		return &olderServer{spillHarness{f: newFixture(t, srv, 5*time.Second, 100)}}
	})
}

type olderServer struct{ spillHarness }

func (h *olderServer) Open(t testing.TB) consumer.SpillLog {
	s := h.f.spillLog(t)
	s.atomic, s.direct = false, false
	return s
}

func spillMsgOf(p consumer.Partition, off int64, value []byte, hs ...consumer.Header) *consumer.Message {
	return &consumer.Message{
		Value: value, Headers: hs, Topic: "src.t", Stream: strings.SplitN(p.Topic, "/", 2)[0],
		Partition: p, Offset: off, Time: time.Unix(1700000000, off).UTC(),
	}
}

func readLane(t *testing.T, s *SpillLog, lane consumer.SpillLane) []*consumer.Message {
	t.Helper()
	var out []*consumer.Message
	from := int64(-1)
	for range 1000 {
		ms, err := s.Read(testCtx(t), lane, from, 64)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) == 0 {
			return out
		}
		out = append(out, ms...)
		from = ms[len(ms)-1].SpillPos + 1
	}
	t.Fatal("the lane never ended")
	return nil
}

func sameMessage(t *testing.T, what string, got, want *consumer.Message) {
	t.Helper()
	switch {
	case !bytes.Equal(got.Value, want.Value):
		t.Fatalf("%s: value of %d bytes, want %d (equal: %v)", what, len(got.Value), len(want.Value), bytes.Equal(got.Value, want.Value))
	case (got.Key == nil) != (want.Key == nil) || !bytes.Equal(got.Key, want.Key):
		t.Fatalf("%s: key %q, want %q", what, got.Key, want.Key)
	case !slices.EqualFunc(got.Headers, want.Headers, func(a, b consumer.Header) bool { return a.Key == b.Key && bytes.Equal(a.Value, b.Value) }):
		t.Fatalf("%s: headers %q, want %q", what, got.Headers, want.Headers)
	case got.Topic != want.Topic || got.Stream != want.Stream || got.Offset != want.Offset || got.Partition != want.Partition:
		t.Fatalf("%s: %s/%s %v@%d, want %s/%s %v@%d", what, got.Stream, got.Topic, got.Partition, got.Offset, want.Stream, want.Topic, want.Partition, want.Offset)
	case !got.Time.Equal(want.Time):
		t.Fatalf("%s: time %v, want %v", what, got.Time, want.Time)
	case !got.Refed:
		t.Fatalf("%s: Refed not set", what)
	}
}

// TestSpillKeepsMaxPayloadMessagesByteForByte spills messages at the server's max payload (with
// headers, including Nats- ones the stream must not act on): they are
// stored out of line, read back byte for byte, and their bodies deleted
// when the lane is committed.
func TestSpillKeepsMaxPayloadMessagesByteForByte(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	s := f.spillLog(t)
	p := homePartition(f.stream, f.durable)
	lane := consumer.SpillLane{Tenant: "acme", Partition: p}
	hs := []consumer.Header{{Key: "Nats-Expected-Stream", Value: []byte("NOPE")}, {Key: "Nats-Msg-Id", Value: []byte("orig-1")}, {Key: "trace", Value: []byte("t-1")}}
	limit := f.nc.MaxPayload()
	var want []*consumer.Message
	for i, size := range []int64{limit, limit - 200, 10, 0} {
		v := make([]byte, size)
		_, _ = rand.Read(v)
		want = append(want, spillMsgOf(p, int64(100+i), v, hs...))
	}
	if err := s.Append(testCtx(t), lane, want); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.OutOfLine != 2 || st.Appended != 4 {
		t.Fatalf("stats %+v: want the two messages near max payload out of line", st)
	}
	// Appended again (a retry after a lost acknowledgement): the stream
	// drops the copies, and their bodies are deleted.
	if err := s.Append(testCtx(t), lane, want); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Duplicates != 4 || st.Appended != 4 {
		t.Fatalf("stats after appending again %+v", st)
	}
	got := readLane(t, s, lane)
	if len(got) != len(want) {
		t.Fatalf("read %d, appended %d", len(got), len(want))
	}
	for i := range got {
		sameMessage(t, fmt.Sprintf("message %d", i), got[i], want[i])
	}
	store, err := f.js.ObjectStore(testCtx(t), s.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	objects := func() int { return len(listBodies(t, store, s.Bucket())) }
	if n := objects(); n != 2 {
		t.Fatalf("%d bodies stored, want 2", n)
	}
	if err := s.Commit(testCtx(t), lane, got[len(got)-1].SpillPos+1); err != nil {
		t.Fatal(err)
	}
	if n := objects(); n != 0 {
		t.Fatalf("%d bodies left after the lane was committed", n)
	}
	if rest := readLane(t, s, lane); len(rest) != 0 {
		t.Fatalf("%d records left after the commit", len(rest))
	}
}

// TestSpillHostileTenantsStayApart: keys that look like other tenants' tokens,
// wildcards, paths, white space, CR/LF, non-UTF-8 and over-long keys each
// get a subject of their own under the prefix, read back only their own
// messages, and come back from Pending exactly, also from a new SpillLog.
func TestSpillHostileTenantsStayApart(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	s := f.spillLog(t)
	p := homePartition(f.stream, f.durable)
	long := strings.Repeat("x.y ", 300)
	tenants := []string{"acme", "acme.>", "*", ">", "acme_2e_3e", "../../etc", " padded ", "cr\r\nlf", "\xff\xfe", "_none", long, long + "\n"}
	for i, tn := range tenants {
		m := spillMsgOf(p, int64(i), []byte(tn), consumer.Header{Key: "tenant", Value: []byte("t" + strconv.Itoa(i))})
		if err := s.Append(testCtx(t), consumer.SpillLane{Tenant: tn, Partition: p}, []*consumer.Message{m}); err != nil {
			t.Fatalf("append for %q: %v", tn, err)
		}
	}
	info, err := f.js.Stream(testCtx(t), s.Stream())
	if err != nil {
		t.Fatal(err)
	}
	sinfo, err := info.Info(testCtx(t), jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	if len(sinfo.State.Subjects) != len(tenants) {
		t.Fatalf("%d subjects for %d tenants: %v", len(sinfo.State.Subjects), len(tenants), sinfo.State.Subjects)
	}
	for subj := range sinfo.State.Subjects {
		if _, ok := dlq.SplitNATSSubject(s.Prefix(), subj); !ok {
			t.Fatalf("subject %q is not one token under %q", subj, s.Prefix())
		}
	}
	for _, log := range []*SpillLog{s, f.spillLog(t)} {
		lanes, err := log.Pending(testCtx(t), p)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, l := range lanes {
			got = append(got, l.Tenant)
		}
		slices.Sort(got)
		want := slices.Clone(tenants)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("Pending = %q, want %q", got, want)
		}
		for i, tn := range tenants {
			ms := readLane(t, log, consumer.SpillLane{Tenant: tn, Partition: p})
			if len(ms) != 1 || string(ms[0].Value) != tn || ms[0].Offset != int64(i) {
				var vs []string
				for _, m := range ms {
					vs = append(vs, string(m.Value))
				}
				t.Fatalf("lane %q reads %q", tn, vs)
			}
		}
	}
}

// TestSpillStoresAnAppendedBatchOnce: appending a batch again (a retry after a lost
// acknowledgement, or a redelivery) stores nothing twice, in both append
// modes, and a batch of old and new messages stores the new ones in order.
func TestSpillStoresAnAppendedBatchOnce(t *testing.T) {
	t.Parallel()
	for _, atomicMode := range []bool{true, false} {
		t.Run(fmt.Sprintf("atomic=%v", atomicMode), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, nil, 5*time.Second, 100)
			s := f.spillLog(t)
			if !s.Stats().Atomic {
				t.Fatal("the in-process server makes no atomic spill stream")
			}
			s.atomic, s.atomicMin = atomicMode, 2 // these batches are small
			p := homePartition(f.stream, f.durable)
			lane := consumer.SpillLane{Tenant: "acme", Partition: p}
			var batch []*consumer.Message
			for i := range 10 {
				batch = append(batch, spillMsgOf(p, int64(i), []byte(fmt.Sprint(i))))
			}
			for _, b := range [][]*consumer.Message{batch[:6], batch[:6], batch[3:], batch} {
				if err := s.Append(testCtx(t), lane, b); err != nil {
					t.Fatal(err)
				}
			}
			got := readLane(t, s, lane)
			var vs []string
			for _, m := range got {
				vs = append(vs, string(m.Value))
			}
			if want := []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}; !slices.Equal(vs, want) {
				t.Fatalf("lane holds %q, want %q", vs, want)
			}
			if st := s.Stats(); st.Appended != 10 || st.Duplicates != 6+3+10 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestSpillAppendsOnlyLargeBatchesAtomically: on a stream that takes atomic batches, an
// append of fewer than atomicMinMsgs records goes one record at a time
// (an atomic batch costs the server a store of its own) and a larger one
// as one atomic batch; both land in order.
func TestSpillAppendsOnlyLargeBatchesAtomically(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	s := f.spillLog(t)
	if !s.Stats().Atomic {
		t.Fatal("the in-process server makes no atomic spill stream")
	}
	p := homePartition(f.stream, f.durable)
	lane := consumer.SpillLane{Tenant: "acme", Partition: p}
	var batch []*consumer.Message
	for i := range 2 * atomicMinMsgs {
		batch = append(batch, spillMsgOf(p, int64(i), []byte(fmt.Sprint(i))))
	}
	small := batch[:atomicMinMsgs-1]
	if err := s.Append(testCtx(t), lane, small); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.AtomicBatches != 0 || st.Appended != uint64(len(small)) {
		t.Fatalf("after %d records: stats %+v, want them one at a time", len(small), st)
	}
	if err := s.Append(testCtx(t), lane, batch[len(small):len(small)+atomicMinMsgs]); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.AtomicBatches != 1 || st.Appended != uint64(len(small)+atomicMinMsgs) {
		t.Fatalf("after %d more records: stats %+v, want one atomic batch", atomicMinMsgs, st)
	}
	got := readLane(t, s, lane)
	if len(got) != len(small)+atomicMinMsgs {
		t.Fatalf("lane holds %d records, want %d", len(got), len(small)+atomicMinMsgs)
	}
	for i, m := range got {
		if string(m.Value) != fmt.Sprint(i) {
			t.Fatalf("record %d holds %q, want %q", i, m.Value, fmt.Sprint(i))
		}
	}
}

// TestSpillRefusesForeignStream: a stream of live data named as the spill
// stream is refused, untouched.
func TestSpillRefusesForeignStream(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	f.publish(t, "acme", "live")
	_, err := NewSpillLog(testCtx(t), f.js, f.stream, f.durable, WithSpillStream(f.stream, f.subject))
	if !errors.Is(err, ErrNotSpill) {
		t.Fatalf("NewSpillLog on a live stream = %v, want ErrNotSpill", err)
	}
	for name, opt := range map[string]SpillOption{
		"nil":           nil,
		"wild prefix":   WithSpillStream("S", "a.*"),
		"dotted stream": WithSpillStream("S.T", "a.b"),
		"bucket":        WithSpillBodyBucket("a b"),
		"timeout":       WithSpillTimeout(0),
		"logger":        WithSpillLogger(nil),
	} {
		if _, err := NewSpillLog(testCtx(t), f.js, f.stream, f.durable, opt); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}

// Backlog lists the lanes of every partition, the home one and a consumer
// group's, each with its partition and record count.
func TestSpillBacklogListsEveryPartition(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	h := &spillHarness{f: newFixture(t, srv, 5*time.Second, 100)}
	s := h.f.spillLog(t)
	home, other := h.Partition(), h.Other()
	ctx := testCtx(t)
	for i, lane := range []consumer.SpillLane{
		{Tenant: "acme", Partition: home},
		{Tenant: "acme", Partition: other},
		{Tenant: "a.b*>", Partition: other},
	} {
		msgs := make([]*consumer.Message, i+1)
		for j := range msgs {
			msgs[j] = spillMsgOf(lane.Partition, int64(j), []byte("v"))
		}
		if err := s.Append(ctx, lane, msgs); err != nil {
			t.Fatal(err)
		}
	}
	bs, err := s.Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, b := range bs {
		got[fmt.Sprintf("%s@%s/%d", b.Tenant, b.Partition.Topic, b.Partition.ID)] = b.Records
	}
	want := map[string]uint64{
		fmt.Sprintf("acme@%s/%d", home.Topic, home.ID):    1,
		fmt.Sprintf("acme@%s/%d", other.Topic, other.ID):  2,
		fmt.Sprintf("a.b*>@%s/%d", other.Topic, other.ID): 3,
	}
	if len(got) != len(want) {
		t.Fatalf("backlog %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Fatalf("backlog %v, want %v", got, want)
		}
	}
}

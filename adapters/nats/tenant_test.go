package nats

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ringfence/ringfence/consumer"
)

// FuzzFromSubjectToken checks the token picker against strings.Split on
// any subject (subjects are outside input).
func FuzzFromSubjectToken(f *testing.F) {
	for _, s := range []string{"orders.acme.created", "", ".", "a..b", "single", "a.b.", ".a"} {
		f.Add(s, 1)
		f.Add(s, -1)
	}
	f.Fuzz(func(t *testing.T, subject string, i int) {
		parts := strings.Split(subject, ".")
		j := i
		if j < 0 {
			j += len(parts)
		}
		got, err := FromSubjectToken(i)(&consumer.Message{Topic: subject})
		if j < 0 || j >= len(parts) || parts[j] == "" {
			if err == nil {
				t.Fatalf("%q[%d] = %q, want ErrNoTenant", subject, i, got)
			}
			return
		}
		if err != nil || got != parts[j] {
			t.Fatalf("%q[%d] = %q, %v; want %q", subject, i, got, err, parts[j])
		}
	})
}

func TestAckSeqTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reply string
		seq   uint64
		ts    int64
		ok    bool
	}{
		{"$JS.ACK.ORDERS.work.1.42.40.1700000000000000000.7", 42, 1700000000000000000, true},
		{"$JS.ACK._.ACCHASH.ORDERS.work.2.43.41.1700000000000000001.0.xyz", 43, 1700000000000000001, true},
		{"$JS.ACK.hub.ACCHASH.ORDERS.work.2.44.41.1700000000000000002.0", 44, 1700000000000000002, true},
		{"$JS.ACK.ORDERS.work.1.x.40.1700000000000000000.7", 0, 0, false},
		{"$JS.ACK.ORDERS.work.1.42.40", 0, 0, false},
		{"_INBOX.abc", 0, 0, false},
		{"", 0, 0, false},
	} {
		seq, ts, ok := ackSeqTime(tc.reply)
		if ok != tc.ok || ok && (seq != tc.seq || ts != tc.ts) {
			t.Errorf("ackSeqTime(%q) = %d, %d, %v; want %d, %d, %v", tc.reply, seq, ts, ok, tc.seq, tc.ts, tc.ok)
		}
	}
}

// FuzzAckSeqTime checks the fast ack-subject parser against nats.go's own
// on any subject.
func FuzzAckSeqTime(f *testing.F) {
	f.Add("$JS.ACK.ORDERS.work.1.42.40.1700000000000000000.7")
	f.Add("$JS.ACK._.ACCHASH.ORDERS.work.2.43.41.1700000000000000001.0.xyz")
	f.Add("$JS.ACK.a.b.c.d.e.f.g")
	f.Fuzz(func(t *testing.T, reply string) {
		seq, ts, ok := ackSeqTime(reply)
		if !ok {
			return
		}
		md, err := (&nats.Msg{Reply: reply, Sub: &nats.Subscription{}}).Metadata()
		if err != nil {
			t.Fatalf("%q: fast parser accepted (%d, %d), nats.go refused: %v", reply, seq, ts, err)
		}
		if md.Sequence.Stream != seq || md.Timestamp.UnixNano() != ts {
			t.Fatalf("%q: fast (%d, %d), nats.go (%d, %d)", reply, seq, ts, md.Sequence.Stream, md.Timestamp.UnixNano())
		}
	})
}

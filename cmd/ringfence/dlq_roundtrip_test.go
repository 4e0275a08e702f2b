package main

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	rfkafka "github.com/ringfence/ringfence/adapters/kafka"
	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/kafkatest"
	"github.com/ringfence/ringfence/internal/natstest"
)

// hostileKeys are tenant keys a newcomer's producers may well send.
var hostileKeys = []string{
	"acme", "ACME", "zeta", "evil.*> /../x", "\xff\xfe", "a\x00b", "",
	strings.Repeat("long.key/", 40), "tab\tkey", " spaced ", `back\slash"quote`, "_none",
}

// dlqBroker is a broker with a DLQ the CLI can reach.
type dlqBroker struct {
	base  []string // flags naming the DLQ
	write func(t *testing.T, r *dlq.Record)
	// source is where replays go: a Kafka topic or a NATS subject.
	source string
	// sourceCount counts the messages in the source with value v.
	sourceCount func(t *testing.T, v []byte) int
}

func kafkaBroker(t *testing.T) dlqBroker {
	t.Helper()
	c := kafkatest.MustStart(t, kfake.SeedTopics(1, "orders"))
	sink, err := rfkafka.NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	return dlqBroker{
		base:   []string{"--kafka", c.Addrs()[0], "--topic", "orders"},
		source: "orders",
		write: func(t *testing.T, r *dlq.Record) {
			t.Helper()
			if err := sink.Write(ctxFor(t), r); err != nil {
				t.Fatal(err)
			}
		},
		sourceCount: func(t *testing.T, v []byte) int {
			t.Helper()
			return countKafka(t, c.Addrs(), "orders", v)
		},
	}
}

func natsBroker(t *testing.T) dlqBroker {
	t.Helper()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx := ctxFor(t)
	src, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	q, err := rfnats.NewDLQ(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	return dlqBroker{
		base:   []string{"--nats", srv.URL(), "--stream", rfnats.DefaultDLQStream},
		source: "orders.eu",
		write: func(t *testing.T, r *dlq.Record) {
			t.Helper()
			r.Stream, r.Sequence, r.Offset = "ORDERS", uint64(r.Offset)+1, -1
			if err := q.Write(ctxFor(t), r); err != nil {
				t.Fatal(err)
			}
		},
		sourceCount: func(t *testing.T, v []byte) int {
			t.Helper()
			n := 0
			info, err := src.Info(ctxFor(t))
			if err != nil {
				t.Fatal(err)
			}
			for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
				m, err := src.GetMsg(ctxFor(t), seq)
				if err == nil && bytes.Equal(m.Data, v) {
					n++
				}
			}
			return n
		},
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Every hostile key round-trips through ls, peek, replay and purge, in JSON
// and as text, addressed by its token.
func TestDLQHostileKeysRoundTrip(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(*testing.T) dlqBroker{"kafka": kafkaBroker, "nats": natsBroker} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := open(t)
			now := time.Now().UTC()
			offset := int64(0)
			value := func(key string, i int) []byte { return append([]byte{byte('0' + i), 0xff, 0}, key...) }
			for _, key := range hostileKeys {
				for i := range 2 {
					r := &dlq.Record{
						Tenant: key, Value: value(key, i), Headers: []dlq.Header{{Key: "tenant", Value: []byte(key)}},
						Source: b.source, Offset: offset, Group: "billing", Attempts: 2,
						FirstFailure: now, LastFailure: now, Error: "boom", Reason: dlq.ReasonPermanent,
					}
					if key == "" {
						r.Reason = dlq.ReasonNoTenant
					}
					offset++
					b.write(t, r)
				}
			}

			// ls --json: one line per key, in raw-key order, each key whole.
			code, out, errs := cli(t, append([]string{"dlq", "ls", "--json"}, b.base...)...)
			if code != 0 {
				t.Fatalf("ls --json: exit %d %s", code, errs)
			}
			rows := jsonLines[lsLine](t, out, "tenant")
			var got []string
			for _, r := range rows {
				k := rawKey(t, r.Tenant)
				got = append(got, k)
				if r.Count != 2 || r.Tenant.Token != dlq.TenantToken(k) || r.Tenant.NoTenant != (k == "") {
					t.Errorf("ls row %+v for key %q", r, k)
				}
			}
			want := slices.Clone(hostileKeys)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("ls --json keys %q, want %q (sorted by raw key)", got, want)
			}

			// ls as text: a row per key, in the same order, with its token;
			// the no-tenant bucket first, named.
			code, out, errs = cli(t, append([]string{"dlq", "ls"}, b.base...)...)
			if code != 0 {
				t.Fatalf("ls: exit %d %s", code, errs)
			}
			t.Logf("ls:\n%s", out)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != len(want)+1 {
				t.Fatalf("ls has %d lines, want %d", len(lines), len(want)+1)
			}
			for i, k := range want {
				if f := strings.Fields(lines[i+1]); !strings.HasPrefix(lines[i+1], tenantLabel(k)) || !slices.Contains(f, dlq.TenantToken(k)) {
					t.Errorf("ls line %q, want key %q shown as %q with token %s", lines[i+1], k, tenantLabel(k), dlq.TenantToken(k))
				}
			}
			if !strings.HasPrefix(lines[1], "(no tenant)") || !strings.Contains(lines[1], dlq.NoTenantToken) {
				t.Errorf("first row %q, want the no-tenant bucket with its token", lines[1])
			}

			for _, key := range hostileKeys {
				tok := dlq.TenantToken(key)
				by := []string{"--tenant-token", tok}

				code, out, errs := cli(t, append(append([]string{"dlq", "peek", "--json"}, by...), b.base...)...)
				if code != 0 {
					t.Fatalf("peek --json %q: exit %d %s", key, code, errs)
				}
				recs := jsonLines[recordLine](t, out, "record")
				if len(recs) != 2 {
					t.Fatalf("peek --json %q: %d records", key, len(recs))
				}
				for i, r := range recs {
					if rawKey(t, r.Tenant) != key || r.Tenant.Token != tok || !bytes.Equal(rawBytes(t, r.Value), value(key, i)) {
						t.Errorf("peek --json %q record %d: tenant %+v value %+v", key, i, r.Tenant, r.Value)
					}
					if len(r.Headers) != 1 || !bytes.Equal(rawBytes(t, &r.Headers[0].Key), []byte("tenant")) || !bytes.Equal(rawBytes(t, r.Headers[0].Value), []byte(key)) {
						t.Errorf("peek --json %q record %d: headers %+v", key, i, r.Headers)
					}
				}

				code, out, errs = cli(t, append(append([]string{"dlq", "peek"}, by...), b.base...)...)
				if code != 0 || !strings.Contains(out, "tenant:") || !strings.Contains(out, tenantLabel(key)+" (token "+tok+")") ||
					!strings.Contains(out, printable(string(value(key, 0)), 200)) {
					t.Errorf("peek %q as text: exit %d %s\n%s", key, code, errs, out)
				}

				code, out, errs = cli(t, append(append([]string{"dlq", "replay", "--json", "--limit", "1"}, by...), b.base...)...)
				if code != 0 {
					t.Fatalf("replay --json %q: exit %d %s", key, code, errs)
				}
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if len(lines) != 2 {
					t.Fatalf("replay --json %q: %q", key, out)
				}
				if moved := jsonLines[recordLine](t, lines[0], "record"); len(moved) != 1 || !bytes.Equal(rawBytes(t, moved[0].Value), value(key, 0)) {
					t.Errorf("replay --json %q moved %+v", key, moved)
				}
				if sum := jsonLines[replayLine](t, lines[1], "replay"); len(sum) != 1 || sum[0].Moved != 1 || rawKey(t, sum[0].Tenant) != key {
					t.Errorf("replay --json %q summary %+v", key, sum)
				}
				if n := b.sourceCount(t, value(key, 0)); n != 1 {
					t.Errorf("replay of %q reached the source %d times", key, n)
				}

				code, out, errs = cli(t, append(append([]string{"dlq", "purge", "--yes"}, by...), b.base...)...)
				if code != 0 || !strings.Contains(out, "purged 1 dead letter(s) of tenant ") {
					t.Errorf("purge %q: exit %d %q %s", key, code, out, errs)
				}
			}
			if code, out, _ := cli(t, append([]string{"dlq", "ls", "--json"}, b.base...)...); code != 0 || out != "" {
				t.Fatalf("after purging everyone: exit %d, %q", code, out)
			}
		})
	}
}

// One message dead-lettered three times (redeliveries) is one row, count
// 1, one peeked record with three copies, and one replay.
func TestDLQCopiesCountOnce(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(*testing.T) dlqBroker{"kafka": kafkaBroker, "nats": natsBroker} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := open(t)
			for attempt := range 3 {
				b.write(t, &dlq.Record{Tenant: "acme", Value: []byte("poison"), Source: b.source, Offset: 41, Attempts: attempt + 1, Reason: dlq.ReasonPoison})
			}
			rows := lsJSON(t, b.base)
			if len(rows) != 1 || rows["acme"].Count != 1 {
				t.Fatalf("ls: %+v; want acme once, count 1", rows)
			}
			code, out, errs := cli(t, append([]string{"dlq", "ls", "--copies"}, b.base...)...)
			if code != 0 || !strings.Contains(out, "RECORDS") {
				t.Fatalf("ls --copies: exit %d %s %s", code, out, errs)
			}
			t.Logf("ls --copies:\n%s", out)
			code, out, errs = cli(t, append([]string{"dlq", "peek", "--json", "--tenant", "acme"}, b.base...)...)
			recs := jsonLines[recordLine](t, out, "record")
			if code != 0 || len(recs) != 1 || len(recs[0].Copies) != rows["acme"].Records || recs[0].ID == "" {
				t.Fatalf("peek --json: exit %d, %d records, %s", code, len(recs), errs)
			}
			code, out, errs = cli(t, append([]string{"dlq", "peek", "--copies", "--tenant", "acme"}, b.base...)...)
			if code != 0 || strings.Count(out, "copy:") != rows["acme"].Records {
				t.Fatalf("peek --copies: exit %d %s\n%s", code, errs, out)
			}
			code, out, errs = cli(t, append([]string{"dlq", "replay", "--tenant", "acme"}, b.base...)...)
			if code != 0 || !strings.Contains(out, "replayed 1 dead letter(s)") {
				t.Fatalf("replay: exit %d %q %s", code, out, errs)
			}
			if n := b.sourceCount(t, []byte("poison")); n != 1 {
				t.Fatalf("the source got the message back %d times, want once", n)
			}
			if rows := lsJSON(t, b.base); len(rows) != 0 {
				t.Fatalf("after replay: %+v", rows)
			}
		})
	}
}

// The NATS DLQ's duplicate window keeps one record; copies from before it
// (an older ringfence, or a redelivery after the window) count once too.
func TestDLQCopiesCountOnceNATSPastTheWindow(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx := ctxFor(t)
	if _, err := rfnats.NewDLQ(ctx, js); err != nil {
		t.Fatal(err)
	}
	r := &dlq.Record{Tenant: "acme", Value: []byte("poison"), Source: "orders.eu", Offset: -1, Stream: "ORDERS", Sequence: 9, Reason: dlq.ReasonPoison}
	h := nats.Header{}
	for _, x := range r.EncodeHeaders() {
		h.Add(x.Key, string(x.Value))
	}
	for range 3 {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: dlq.NATSSubject(rfnats.DefaultDLQPrefix, "acme"), Header: h, Data: r.Value}); err != nil {
			t.Fatal(err)
		}
	}
	base := []string{"--nats", srv.URL(), "--stream", rfnats.DefaultDLQStream}
	if rows := lsJSON(t, base); rows["acme"].Count != 1 || rows["acme"].Records != 3 {
		t.Fatalf("ls: %+v; want count 1 over 3 records", rows["acme"])
	}
}

// countKafka counts the messages of topic/0 whose value is v.
func countKafka(t *testing.T, addrs []string, topic string, v []byte) int {
	t.Helper()
	ctx := ctxFor(t)
	cl := &kafkago.Client{Addr: kafkago.TCP(addrs...)}
	lo, err := cl.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: {kafkago.LastOffsetOf(0)}}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for off, end := int64(0), lo.Topics[topic][0].LastOffset; off < end; {
		resp, err := cl.Fetch(ctx, &kafkago.FetchRequest{Topic: topic, Offset: off, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: time.Second})
		if err != nil || resp.Error != nil {
			t.Fatalf("fetch %s at %d: %v %v", topic, off, err, resp.Error)
		}
		for {
			r, err := resp.Records.ReadRecord()
			if err != nil {
				break
			}
			if r.Offset < off {
				continue
			}
			off = r.Offset + 1
			if r.Value != nil {
				if b, _ := io.ReadAll(r.Value); bytes.Equal(b, v) {
					n++
				}
			}
		}
	}
	return n
}

// The CLI peeks and replays a dead letter as large as its broker allows
// byte for byte.
func TestDLQBigMessageRoundTrip(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(*testing.T) (dlqBroker, int){
		"kafka": func(t *testing.T) (dlqBroker, int) { return kafkaBroker(t), 1048000 }, // near the default 1 MiB limit
		"nats":  func(t *testing.T) (dlqBroker, int) { return natsBroker(t), 1 << 20 },  // the default max payload
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, size := open(t)
			value := bytes.Repeat([]byte{0xff, 0, 'x', '\n'}, size/4)
			b.write(t, &dlq.Record{Tenant: "acme", Value: value, Source: b.source, Offset: 5, Reason: dlq.ReasonPermanent})
			code, out, errs := cli(t, append([]string{"dlq", "peek", "--json", "--tenant", "acme"}, b.base...)...)
			recs := jsonLines[recordLine](t, out, "record")
			if code != 0 || len(recs) != 1 || !bytes.Equal(rawBytes(t, recs[0].Value), value) {
				t.Fatalf("peek --json: exit %d %s, %d records", code, errs, len(recs))
			}
			code, out, errs = cli(t, append([]string{"dlq", "replay", "--tenant", "acme"}, b.base...)...)
			if code != 0 || !strings.Contains(out, "replayed 1") {
				t.Fatalf("replay: exit %d %q %s", code, out, errs)
			}
			if n := b.sourceCount(t, value); n != 1 {
				t.Fatalf("the source holds the value byte for byte %d times, want 1", n)
			}
		})
	}
}

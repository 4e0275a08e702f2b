package integration

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/internal/brokertest"
)

// TestKafkaContainerKeepsDataAcrossRestart writes through the kfake container
// with kafka-go, stops and starts the container, and reads everything back,
// including the consumer group's committed offset.
func TestKafkaContainerKeepsDataAcrossRestart(t *testing.T) {
	t.Parallel()
	k := brokertest.StartKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const topic, n = "smoke", 20

	w := &kafka.Writer{Addr: kafka.TCP(k.Addr), Topic: topic, AllowAutoTopicCreation: true,
		RequiredAcks: kafka.RequireAll, BatchTimeout: 10 * time.Millisecond}
	defer w.Close()
	writeN := func(from, to int) {
		t.Helper()
		var msgs []kafka.Message
		for i := from; i < to; i++ {
			msgs = append(msgs, kafka.Message{Key: fmt.Appendf(nil, "k%d", i%4), Value: fmt.Appendf(nil, "m%03d", i)})
		}
		err := brokertest.PollUntil(ctx, 30*time.Second, 200*time.Millisecond, func(ctx context.Context) error {
			return w.WriteMessages(ctx, msgs...)
		})
		if err != nil {
			t.Fatalf("write %d..%d: %v", from, to, err)
		}
	}
	writeN(0, n)

	// Read half with a group and commit, then restart.
	got := map[string]bool{}
	readGroup := func(want int) {
		t.Helper()
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{k.Addr}, Topic: topic, GroupID: "smoke-group",
			MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond, StartOffset: kafka.FirstOffset,
			HeartbeatInterval: 500 * time.Millisecond, SessionTimeout: 6 * time.Second})
		defer r.Close()
		rctx, rcancel := context.WithTimeout(ctx, 45*time.Second)
		defer rcancel()
		for i := 0; i < want; i++ {
			m, err := r.FetchMessage(rctx)
			if err != nil {
				t.Fatalf("fetch %d of %d: %v", i, want, err)
			}
			if got[string(m.Value)] {
				t.Fatalf("%s delivered again after its commit", m.Value)
			}
			got[string(m.Value)] = true
			if err := r.CommitMessages(rctx, m); err != nil {
				t.Fatalf("commit: %v", err)
			}
		}
	}
	readGroup(n / 2)

	k.Restart(t)
	writeN(n, n+5)
	readGroup(n/2 + 5)
	if len(got) != n+5 {
		t.Fatalf("read %d distinct messages across the restart, want %d", len(got), n+5)
	}

	// The whole log is still there from offset 0.
	total := 0
	for p := 0; p < 3; p++ {
		conn, err := kafka.DialLeader(ctx, "tcp", k.Addr, topic, p)
		if err != nil {
			t.Fatalf("dial leader p%d: %v", p, err)
		}
		first, last, err := conn.ReadOffsets()
		conn.Close()
		if err != nil {
			t.Fatalf("offsets p%d: %v", p, err)
		}
		if first != 0 {
			t.Errorf("p%d first offset %d after restart, want 0", p, first)
		}
		total += int(last - first)
	}
	if total != n+5 {
		t.Fatalf("log holds %d records after restart, want %d", total, n+5)
	}

	t.Run("kcat", func(t *testing.T) {
		kcat, err := exec.LookPath("kcat")
		if err != nil {
			if kcat, err = exec.LookPath("kafkacat"); err != nil {
				t.Skip("kcat/kafkacat not installed")
			}
		}
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		defer ccancel()
		out, err := exec.CommandContext(cctx, kcat, "-b", k.Addr, "-C", "-t", topic, "-e", "-q", "-f", "%s\n").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", kcat, err, out)
		}
		lines := strings.Fields(string(bytes.TrimSpace(out)))
		if len(lines) != n+5 {
			t.Fatalf("kcat read %d records, want %d:\n%s", len(lines), n+5, out)
		}
	})
}

// TestNATSContainerKeepsStreamAcrossRestart publishes to a JetStream file
// stream in the NATS container, consumes part with a durable consumer,
// restarts the container, and consumes the rest: nothing lost, nothing
// acknowledged redelivered.
func TestNATSContainerKeepsStreamAcrossRestart(t *testing.T) {
	t.Parallel()
	b := brokertest.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 20

	nc, err := nats.Connect(b.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SMOKE", Subjects: []string{"smoke.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, err := js.Publish(ctx, fmt.Sprintf("smoke.t%d", i%3), fmt.Appendf(nil, "m%03d", i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "smoke", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	consume := func(cons jetstream.Consumer, want int) {
		t.Helper()
		for len(got) < want {
			batch, err := cons.Fetch(want-len(got), jetstream.FetchMaxWait(2*time.Second))
			if err != nil {
				t.Fatalf("fetch: %v", err)
			}
			nb := 0
			for m := range batch.Messages() {
				nb++
				if got[string(m.Data())] {
					t.Fatalf("%s redelivered after its ack", m.Data())
				}
				got[string(m.Data())] = true
				if err := m.DoubleAck(ctx); err != nil {
					t.Fatalf("ack: %v", err)
				}
			}
			if nb == 0 {
				t.Fatalf("fetch returned nothing with %d of %d consumed (%v)", len(got), want, batch.Error())
			}
		}
	}
	consume(cons, n/2)

	b.Restart(t)

	// A fresh connection: the stream, its messages and the durable's ack
	// floor must all have survived on disk.
	nc2, err := nats.Connect(b.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	js2, _ := jetstream.New(nc2)
	s2, err := js2.Stream(ctx, "SMOKE")
	if err != nil {
		t.Fatalf("stream after restart: %v", err)
	}
	info, err := s2.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n {
		t.Fatalf("stream holds %d messages after restart, want %d", info.State.Msgs, n)
	}
	cons2, err := s2.Consumer(ctx, "smoke")
	if err != nil {
		t.Fatalf("durable after restart: %v", err)
	}
	consume(cons2, n)
}

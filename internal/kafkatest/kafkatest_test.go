package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

func TestRestartKeepsAddressAndData(t *testing.T) {
	t.Parallel()
	c := MustStart(t, kfake.SeedTopics(1, "t"), kfake.DataDir(t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := &kafka.Writer{Addr: kafka.TCP(c.Addrs()...), Topic: "t", RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	addr := c.Addrs()[0]
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := c.Addrs()[0]; got != addr {
		t.Fatalf("address changed across restart: %s -> %s", addr, got)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: c.Addrs(), Topic: "t", MaxWait: 50 * time.Millisecond})
	defer r.Close()
	m, err := r.ReadMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Value) != "before" {
		t.Fatalf("after restart read %q, want %q", m.Value, "before")
	}
}

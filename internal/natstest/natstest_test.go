package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestRestartKeepsStreamData(t *testing.T) {
	s := Start(t)
	_, js := s.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	url := s.URL()
	s.Restart()
	if s.URL() != url {
		t.Fatalf("URL changed across restart: %s -> %s", url, s.URL())
	}
	_, js2 := s.JetStream(t)
	st, err := js2.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "x" || m.Subject != "t.a" {
		t.Fatalf("got %q on %s", m.Data, m.Subject)
	}
}

func TestNewJetStreamServesUntilStopped(t *testing.T) {
	nc, js, stop, err := NewJetStream()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	url := nc.ConnectedUrl()
	stop()
	stop() // idempotent
	if !nc.IsClosed() {
		t.Fatal("connection open after stop")
	}
	if nc2, err := nats.Connect(url, nats.NoReconnect()); err == nil {
		nc2.Close()
		t.Fatalf("connected to %s after stop", url)
	}
}

package nats

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// countedMsg is a jetstream.Msg whose Ack is counted (the other methods
// are never called by the acker).
type countedMsg struct {
	jetstream.Msg
	acks *atomic.Int64
	fail bool
}

func (m countedMsg) Ack() error {
	m.acks.Add(1)
	if m.fail {
		return errors.New("connection closed")
	}
	return nil
}

// The acker queues acks only while it runs, sends every queued ack, and
// sends what is left when it stops: none is dropped and none is sent twice.
func TestAckerSendsEveryAckOnce(t *testing.T) {
	var acks atomic.Int64
	a := newAcker(slog.New(slog.DiscardHandler))
	if a.add(countedMsg{acks: &acks}) {
		t.Fatal("a stopped acker queued an ack (it would never be sent)")
	}
	a.start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.run(ctx); close(done) }()

	const writers, each = 8, 5000
	var queued atomic.Int64
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range each {
				if a.add(countedMsg{acks: &acks}) {
					queued.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if queued.Load() != writers*each {
		t.Fatalf("queued %d of %d while running", queued.Load(), writers*each)
	}
	// Acks go out in bursts while it runs, not only at the end.
	deadline := time.Now().Add(30 * time.Second)
	for acks.Load() < writers*each && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := acks.Load(); got != writers*each {
		t.Fatalf("%d of %d acks sent while running", got, writers*each)
	}
	if n := a.queued(); n != 0 {
		t.Fatalf("%d acks still queued", n)
	}

	// Stopping sends what is queued; afterwards add says the caller acks.
	a.mu.Lock()
	a.pending = append(a.pending, countedMsg{acks: &acks}, countedMsg{acks: &acks, fail: true})
	a.mu.Unlock()
	cancel()
	<-done
	if got := acks.Load(); got != writers*each+2 {
		t.Fatalf("after stop: %d acks sent, want %d", got, writers*each+2)
	}
	if a.add(countedMsg{acks: &acks}) {
		t.Fatal("a stopped acker queued an ack")
	}
}

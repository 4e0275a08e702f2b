package nats

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ackLinger is how long the acker lets acks gather after the first of a
// burst before it sends them. Acks still go out within about this long of
// Settle, far inside any AckWait.
const ackLinger = time.Millisecond

// acker sends the acks of settled messages in bursts. While Source.Run
// runs, Settle queues the message and returns; the acker's goroutine, woken
// by the first ack of a burst, waits ackLinger and then acks everything
// queued back to back.
//
// Why: JetStream processes each ack under the consumer's lock, the lock its
// delivery loop takes too. Acks sent one by one as each handler returns
// interleave with deliveries and contend on that lock; sent back to back
// they take it in a run (BenchmarkConsume guards this). Nothing changes for at-least-once: a
// message is acked only after the engine settled it, and an ack lost in a
// crash before it went out is a redelivery, as any ack lost in flight is.
//
// Once Run has returned (or before it started) Settle acks at once, so an
// ack is never left queued with no goroutine to send it.
type acker struct {
	log *slog.Logger

	mu      sync.Mutex // guards the fields below; held for no call out
	pending []jetstream.Msg
	running bool
	wake    chan struct{} // buffered 1: a burst began
}

func newAcker(log *slog.Logger) *acker {
	return &acker{log: log, wake: make(chan struct{}, 1)}
}

// add queues h to be acked and reports whether it did; false means the
// acker is not running and the caller acks h itself.
func (a *acker) add(h jetstream.Msg) bool {
	a.mu.Lock()
	if !a.running {
		a.mu.Unlock()
		return false
	}
	first := len(a.pending) == 0
	a.pending = append(a.pending, h)
	a.mu.Unlock()
	if first {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// queued returns how many acks wait to be sent.
func (a *acker) queued() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pending)
}

// start marks the acker running; run must follow.
func (a *acker) start() {
	a.mu.Lock()
	a.running = true
	a.mu.Unlock()
}

// run sends queued acks in bursts until ctx ends, then stops queueing and
// sends what is left.
func (a *acker) run(ctx context.Context) {
	var batch []jetstream.Msg
	for {
		select {
		case <-a.wake:
		case <-ctx.Done():
			a.mu.Lock()
			a.running = false
			batch, a.pending = a.pending, nil
			a.mu.Unlock()
			a.send(batch)
			return
		}
		t := time.NewTimer(ackLinger)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		a.mu.Lock()
		batch, a.pending = a.pending, batch[:0]
		a.mu.Unlock()
		a.send(batch)
		clear(batch)
	}
}

// send acks batch, logging once per batch if any ack could not be sent
// (the server redelivers those messages after AckWait).
func (a *acker) send(batch []jetstream.Msg) {
	var failed int
	var last error
	for _, h := range batch {
		if err := h.Ack(); err != nil {
			failed++
			last = err
		}
	}
	if failed > 0 {
		a.log.Warn("ringfence nats: acks not sent; the server redelivers those messages after AckWait", "count", failed, "err", last)
	}
}

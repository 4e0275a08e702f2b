package nats

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/internal/natstest"
)

// TestSourceStallSoak (RINGFENCE_STALL_ROUNDS=n; skipped without it) reads
// a 50k stream with the Source and a settle-at-once loop n times, each with
// a fresh durable consumer, and fails for any round where nothing was
// settled for 3s, logging the server's view of the consumer then. With
// RINGFENCE_STALL_FRESH set, each round starts its own server and stream
// and reads one message before the other 49,999 are written, as the first
// row of a BenchmarkConsume process does. It hunts the ~30s stall seen
// once in 77 benchmark processes on 2026-12-04 (see the README); each
// round is bounded at 90s.
func TestSourceStallSoak(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("RINGFENCE_STALL_ROUNDS"))
	if rounds == 0 {
		t.Skip("diagnostic")
	}
	const n = 50000
	fresh := os.Getenv("RINGFENCE_STALL_FRESH") != ""
	stalls := 0
	if fresh {
		for r := range rounds {
			t.Run(fmt.Sprint(r), func(t *testing.T) {
				f := newFixture(t, natstest.Start(t), 30*time.Second, 1000)
				publishBench(t, f, 0, 1)
				stalls += diagRound(t, f, 1, r*2)
				publishBench(t, f, 1, n)
				stalls += diagRound(t, f, n, r*2+1)
			})
		}
		t.Logf("%d fresh rounds, %d stalls", rounds, stalls)
		if stalls > 0 {
			t.Errorf("%d stalls of 3s or more", stalls)
		}
		return
	}
	f := newFixture(t, natstest.Start(t), 30*time.Second, 1000)
	publishBench(t, f, 0, n)
	for r := range rounds {
		stalls += diagRound(t, f, n, r)
	}
	t.Logf("%d rounds, %d stalls", rounds, stalls)
	if stalls > 0 {
		t.Errorf("%d stalls of 3s or more", stalls)
	}
}

// diagRound reads the stream's first n messages with a fresh durable and
// returns 1 if nothing was settled for 3s at some point, else 0.
func diagRound(t *testing.T, f *fixture, n, r int) (stalls int) {
	{
		ctx0 := context.Background()
		name := fmt.Sprintf("diag%d", r)
		cons, err := f.js.CreateOrUpdateConsumer(ctx0, f.stream, jetstream.ConsumerConfig{
			Durable: name, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 1000,
		})
		if err != nil {
			t.Fatal(err)
		}
		src, err := NewSource(ctx0, f.js, cons)
		if err != nil {
			t.Fatal(err)
		}
		cs := newCountingSource(src, n)
		ctx, cancel := context.WithCancel(ctx0)
		ran := make(chan error, 1)
		start := time.Now()
		go func() { ran <- src.Run(ctx, settleLoop{src: cs}) }()
		last, lastAt, stalled := int64(-1), time.Now(), false
		tick := time.NewTicker(100 * time.Millisecond)
	wait:
		for {
			select {
			case <-cs.Done():
				break wait
			case <-tick.C:
			}
			if tot := cs.Total(); tot != last {
				if stalled {
					t.Logf("round %d: resumed at %d after %v", r, tot, time.Since(lastAt))
				}
				last, lastAt, stalled = tot, time.Now(), false
				continue
			}
			if !stalled && time.Since(lastAt) > 3*time.Second {
				stalled = true
				stalls++
				info, err := cons.Info(ctx0)
				if err != nil {
					t.Logf("round %d: stalled at %d; info: %v", r, last, err)
				} else {
					t.Logf("round %d: stalled at %d: waiting=%d ackPending=%d pending=%d delivered=%d ackFloor=%d redelivered=%d srcStats=%+v",
						r, last, info.NumWaiting, info.NumAckPending, info.NumPending, info.Delivered.Consumer, info.AckFloor.Consumer, info.NumRedelivered, src.Stats())
				}
			}
			if time.Since(start) > 90*time.Second {
				t.Errorf("round %d: not done in 90s", r)
				break wait
			}
		}
		tick.Stop()
		cancel()
		<-ran
		_ = f.js.DeleteConsumer(ctx0, f.stream, name)
	}
	return stalls
}

package nats_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/internal/natstest"
)

// TestSourceStallSoak (RINGFENCE_STALL_ROUNDS=n; skipped without it) reads
// a 50k stream with the Source and a settle-at-once loop n times, each with
// a fresh durable consumer, and fails for any round where nothing was
// settled for 3s, logging the server's view of the consumer then. With
// RINGFENCE_STALL_FRESH set, each round starts its own server and stream
// and reads one message before the other 49,999 are written, as the first
// row of a BenchmarkConsume process does. It hunts a rare stall of tens of
// seconds in a benchmark process; each round is bounded at 90s.
func TestSourceStallSoak(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("RINGFENCE_STALL_ROUNDS"))
	if rounds == 0 {
		t.Skip("diagnostic")
	}
	const n = 50000
	stalls := 0
	if os.Getenv("RINGFENCE_STALL_FRESH") != "" {
		for r := range rounds {
			t.Run(fmt.Sprint(r), func(t *testing.T) {
				f := newFixture(t, natstest.Start(t))
				publishBench(t, f, 0, 1)
				stalls += soakRound(t, f, 1)
				publishBench(t, f, 1, n)
				stalls += soakRound(t, f, n)
			})
		}
	} else {
		f := newFixture(t, natstest.Start(t))
		publishBench(t, f, 0, n)
		for range rounds {
			stalls += soakRound(t, f, n)
		}
	}
	t.Logf("%d rounds, %d stalls", rounds, stalls)
	if stalls > 0 {
		t.Errorf("%d stalls of 3s or more", stalls)
	}
}

// soakRound reads the stream's first n messages with a fresh durable
// (deleted after the round) and returns 1 if nothing was settled for 3s at
// some point, else 0.
func soakRound(t *testing.T, f *fixture, n int) (stalls int) {
	t.Helper()
	cons := freshConsumer(t, f)
	defer func() { _ = f.js.DeleteConsumer(t.Context(), f.stream, cons.CachedInfo().Name) }()
	src, err := nats.NewSource(t.Context(), f.js, cons)
	if err != nil {
		t.Fatal(err)
	}
	cs := newCountingSource(src, n)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- src.Run(ctx, settleLoop{src: cs}) }()
	defer func() { cancel(); <-ran }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	start, last, lastAt, stalled := time.Now(), int64(-1), time.Now(), false
	for {
		select {
		case <-cs.Done():
			return stalls
		case <-tick.C:
		}
		if tot := cs.Total(); tot != last {
			if stalled {
				t.Logf("resumed at %d after %v", tot, time.Since(lastAt))
			}
			last, lastAt, stalled = tot, time.Now(), false
		} else if !stalled && time.Since(lastAt) > 3*time.Second {
			stalled, stalls = true, 1
			if info, err := cons.Info(t.Context()); err != nil {
				t.Logf("stalled at %d; info: %v", last, err)
			} else {
				t.Logf("stalled at %d: waiting=%d ackPending=%d pending=%d delivered=%d ackFloor=%d redelivered=%d srcStats=%+v",
					last, info.NumWaiting, info.NumAckPending, info.NumPending, info.Delivered.Consumer, info.AckFloor.Consumer, info.NumRedelivered, src.Stats())
			}
		}
		if time.Since(start) > 90*time.Second {
			t.Errorf("not done in 90s")
			return stalls
		}
	}
}

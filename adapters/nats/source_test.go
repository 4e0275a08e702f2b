package nats

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/internal/natstest"
)

func vals(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s-%05d", prefix, i))
	}
	return out
}

func checkInOrder(t *testing.T, tenant string, got []string) {
	t.Helper()
	for i := 1; i < len(got); i++ {
		if got[i] < got[i-1] {
			t.Fatalf("tenant %s: %s delivered after %s", tenant, got[i], got[i-1])
		}
	}
}

func TestSourceDeliversInOrderAndAcks(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 1000)
	for i := range 50 {
		for _, tn := range []string{"acme", "globex", "initech"} {
			f.publish(t, tn, fmt.Sprintf("%s-%05d", tn, i))
		}
	}
	tenant := FromSubjectToken(-1)
	src := f.source(t)
	l := newLoop(src, tenant, nil)
	stop := consumertest.StartSource(t, src, l)
	eventually(t, "150 settled", func() bool { return l.settled.Load() == 150 })
	stop()
	for _, tn := range []string{"acme", "globex", "initech"} {
		checkInOrder(t, tn, l.values(tn))
		if n := l.count(tn); n != 50 {
			t.Fatalf("tenant %s: %d deliveries, want 50", tn, n)
		}
	}
	eventually(t, "ack floor at 150", func() bool {
		info, err := f.consumer(t).Info(testCtx(t))
		return err == nil && info.AckFloor.Stream == 150 && info.NumAckPending == 0
	})
	if l.assigned[src.Partition()] != 1 {
		t.Fatalf("main partition assigned %d times", l.assigned[src.Partition()])
	}
}

// TestServerRestartLosesNothing restarts the server while a source consumes
// (including a tenant whose messages are held across the restart); every
// message is delivered at least once and the consumer ends with nothing
// pending.
func TestServerRestartLosesNothing(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	f := newFixture(t, srv, time.Second, 64)
	const n = 300
	for i := range n {
		f.publish(t, fmt.Sprintf("t%d", i%5), fmt.Sprintf("m-%05d", i))
	}
	tenant := FromSubjectToken(-1)
	src := f.source(t)
	// Tenant t0 is held until the restart is over.
	l := newLoop(src, tenant, func(tn string) bool { return tn == "t0" })
	consumertest.StartSource(t, src, l)
	eventually(t, "a part delivered", func() bool { return l.distinct() >= n/3 })
	srv.Restart()
	f.publishRetry(t, f.subject+".t1", "after-restart")
	l.release()
	eventually(t, "everything delivered", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for i := range n {
			if l.seen[fmt.Sprintf("m-%05d", i)] == 0 {
				return false
			}
		}
		return l.seen["after-restart"] > 0
	})
	eventually(t, "nothing left pending", func() bool {
		info, err := f.consumer(t).Info(testCtx(t))
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
}

// TestHeldMessagesOutliveAckWait holds messages for several AckWaits: the
// Source's InProgress keeps the server from redelivering them.
func TestHeldMessagesOutliveAckWait(t *testing.T) {
	t.Parallel()
	const ackWait = 500 * time.Millisecond
	f := newFixture(t, nil, ackWait, 100)
	f.publish(t, "a", vals("a", 0, 5)...)
	tenant := FromSubjectToken(-1)
	src := f.source(t, WithExtendEvery(ackWait/5))
	l := newLoop(src, tenant, func(string) bool { return true })
	consumertest.StartSource(t, src, l)
	eventually(t, "5 held", func() bool { return l.heldCount() == 5 })
	start := src.Stats().Extends
	// 20 rounds at AckWait/5 span about 4 AckWaits.
	eventually(t, "20 extension rounds", func() bool { return src.Stats().Extends >= start+20 })
	info, err := f.consumer(t).Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 || l.distinct() != 5 || l.count("a") != 5 {
		t.Fatalf("held messages redelivered: server redelivered %d, engine saw %d deliveries", info.NumRedelivered, l.count("a"))
	}
	l.release()
	eventually(t, "acked", func() bool {
		info, err := f.consumer(t).Info(testCtx(t))
		return err == nil && info.NumAckPending == 0 && info.AckFloor.Stream == 5
	})
}

func TestPauseHoldsDeliveriesUntilResume(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	tenant := FromSubjectToken(-1)
	src := f.source(t)
	l := newLoop(src, tenant, nil)
	src.Pause(src.Partition())
	consumertest.StartSource(t, src, l)
	f.publish(t, "a", vals("a", 0, 10)...)
	// The messages reach the client (ack pending) but not the engine.
	eventually(t, "messages pulled by the client", func() bool {
		info, err := f.consumer(t).Info(testCtx(t))
		return err == nil && info.NumAckPending > 0
	})
	if n := l.count("a"); n != 0 {
		t.Fatalf("%d messages delivered while paused", n)
	}
	src.Resume(src.Partition())
	eventually(t, "all delivered after resume", func() bool { return l.settled.Load() == 10 })
	checkInOrder(t, "a", l.values("a"))
}

func TestCoreNATSIsRefused(t *testing.T) {
	t.Parallel()
	srv := natstest.StartCore(t)
	nc := srv.Connect(t)
	_, err := Open(testCtx(t), nc, "ORDERS", "work")
	if !errors.Is(err, ErrCoreNATS) {
		t.Fatalf("Open on a server without JetStream = %v, want ErrCoreNATS", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewDLQ(testCtx(t), js); !errors.Is(err, ErrCoreNATS) {
		t.Fatalf("NewDLQ on a server without JetStream = %v, want ErrCoreNATS", err)
	}
	if _, err := NewSpillLog(testCtx(t), js, "ORDERS", "work"); !errors.Is(err, ErrCoreNATS) {
		t.Fatalf("NewSpillLog on a server without JetStream = %v, want ErrCoreNATS", err)
	}
}

func TestNewSourceRejectsUnusableConsumers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	ctx := testCtx(t)
	ackNone, err := f.js.CreateOrUpdateConsumer(ctx, f.stream, jetstream.ConsumerConfig{Durable: "none", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewSource(ctx, f.js, ackNone); !errors.Is(err, ErrConsumerConfig) {
		t.Fatalf("ack none: %v, want ErrConsumerConfig", err)
	}
	for name, opt := range map[string]SourceOption{
		"extend >= ack wait":  WithExtendEvery(5 * time.Second),
		"pull max 0":          WithPullMaxMessages(0),
		"nil logger":          WithLogger(nil),
		"extend non-positive": WithExtendEvery(0),
		"liveness check 0":    WithLivenessCheck(0),
		"nil option":          nil,
	} {
		if _, err := NewSource(ctx, f.js, f.consumer(t), opt); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}

func TestFromSubjectToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		subject string
		i       int
		want    string
		ok      bool
	}{
		{"orders.acme.created", 1, "acme", true},
		{"orders.acme.created", 0, "orders", true},
		{"orders.acme.created", 2, "created", true},
		{"orders.acme.created", 3, "", false},
		{"orders.acme.created", -1, "created", true},
		{"orders.acme.created", -3, "orders", true},
		{"orders.acme.created", -4, "", false},
		{"orders..created", 1, "", false},
		{"single", 0, "single", true},
	} {
		got, err := FromSubjectToken(tc.i)(&consumer.Message{Topic: tc.subject})
		if tc.ok && (err != nil || got != tc.want) {
			t.Errorf("%s[%d] = %q, %v; want %q", tc.subject, tc.i, got, err, tc.want)
		}
		if !tc.ok && !errors.Is(err, consumer.ErrNoTenant) {
			t.Errorf("%s[%d] = %q, %v; want ErrNoTenant", tc.subject, tc.i, got, err)
		}
	}
}

var _ = context.Background

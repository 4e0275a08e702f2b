package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer/consumertest"
)

// logRecorder is a slog.Handler that keeps the messages of records at Warn
// and above. Safe for concurrent use.
type logRecorder struct {
	mu    sync.Mutex
	warns []string
}

func (l *logRecorder) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	l.warns = append(l.warns, b.String())
	l.mu.Unlock()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// count counts Warn records whose text contains s.
func (l *logRecorder) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, w := range l.warns {
		if strings.Contains(w, s) {
			n++
		}
	}
	return n
}

func TestWhichErrorsAreTerminal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want verdict
	}{
		{jetstream.ErrConsumerDeleted, gone},
		{jetstream.ErrConsumerNotFound, gone},
		{&jetstream.APIError{Code: 404, ErrorCode: jetstream.JSErrCodeStreamNotFound}, gone},
		{&jetstream.APIError{Code: 503, ErrorCode: jetstream.JSErrCodeJetStreamNotEnabledForAccount}, gone},
		{jetstream.ErrJetStreamNotEnabled, gone},
		{nats.ErrConnectionClosed, fatal},
		{jetstream.ErrBadRequest, fatal},
		{jetstream.ErrNoHeartbeat, check},
		{nats.ErrNoResponders, check},
		{jetstream.ErrServerShutdown, retry},
		{jetstream.ErrConsumerLeadershipChanged, retry},
		{nats.ErrTimeout, retry},
		{context.DeadlineExceeded, retry},
		{nats.ErrConnectionReconnecting, retry},
	}
	for _, tt := range tests {
		if got := classify(tt.err); got != tt.want {
			t.Errorf("classify(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// wantGone fails unless err says the consumer is gone, wrapping cause and
// naming the stream and durable.
func wantGone(t testing.TB, f *fixture, err error, causes ...error) {
	t.Helper()
	if !errors.Is(err, ErrConsumerGone) || !strings.Contains(err.Error(), f.stream+"/"+f.durable) {
		t.Fatalf("Run = %v; want ErrConsumerGone naming %s/%s", err, f.stream, f.durable)
	}
	for _, c := range causes {
		if errors.Is(err, c) {
			return
		}
	}
	t.Fatalf("Run = %v; want it to wrap one of %v", err, causes)
}

// A durable deleted while the source consumes ends Run at once (the
// server answers the waiting pull request).
func TestRunEndsWhenConsumerDeleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	tenant := FromSubjectToken(-1)
	src := f.source(t)
	l := newLoop(src, tenant, nil)
	r := consumertest.RunSource(t, src, l)
	f.publish(t, "a", "m1", "m2")
	eventually(t, "delivery", func() bool { return l.distinct() == 2 })
	if err := f.js.DeleteConsumer(testCtx(t), f.stream, f.durable); err != nil {
		t.Fatal(err)
	}
	wantGone(t, f, r.Ended(t, 30*time.Second), jetstream.ErrConsumerDeleted, jetstream.ErrConsumerNotFound)
}

// A durable deleted while the source is paused (its consume callback
// blocked, no pull request waiting) is found by the liveness check.
func TestRunEndsWhenConsumerDeletedWhilePaused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	tenant := FromSubjectToken(-1)
	src := f.source(t, WithLivenessCheck(50*time.Millisecond))
	l := newLoop(src, tenant, nil)
	r := consumertest.RunSource(t, src, l)
	f.publish(t, "a", "m1")
	eventually(t, "delivery", func() bool { return l.distinct() == 1 })
	src.Pause(src.Partition())
	// The next message blocks the consume callback: nats.go then sends no
	// pull request, so the deletion has no one to tell.
	f.publish(t, "a", "m2")
	eventually(t, "the callback blocked by the pause", func() bool {
		info, err := f.consumer(t).Info(testCtx(t))
		return err == nil && info.NumAckPending == 1 && info.NumPending == 0
	})
	if err := f.js.DeleteConsumer(testCtx(t), f.stream, f.durable); err != nil {
		t.Fatal(err)
	}
	// Only the liveness check can tell: the server's "consumer deleted"
	// waits behind the blocked callback.
	wantGone(t, f, r.Ended(t, 30*time.Second), jetstream.ErrConsumerNotFound)
	if n := l.distinct(); n != 1 {
		t.Fatalf("delivered %d messages while paused", n)
	}
}

// Deleting the stream deletes the consumer with it.
func TestRunEndsWhenStreamDeleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	tenant := FromSubjectToken(-1)
	src := f.source(t)
	l := newLoop(src, tenant, nil)
	r := consumertest.RunSource(t, src, l)
	f.publish(t, "a", "m1")
	eventually(t, "delivery", func() bool { return l.distinct() == 1 })
	if err := f.js.DeleteStream(testCtx(t), f.stream); err != nil {
		t.Fatal(err)
	}
	wantGone(t, f, r.Ended(t, 30*time.Second), jetstream.ErrConsumerDeleted, jetstream.ErrConsumerNotFound, jetstream.ErrStreamNotFound)
}

// A connection closed for good (by the application, or after its
// reconnect attempts ran out) ends Run.
func TestRunEndsWhenConnectionClosed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	tenant := FromSubjectToken(-1)
	src := f.source(t)
	l := newLoop(src, tenant, nil)
	r := consumertest.RunSource(t, src, l)
	f.publish(t, "a", "m1")
	eventually(t, "delivery", func() bool { return l.distinct() == 1 })
	f.nc.Close()
	err := r.Ended(t, 30*time.Second)
	if !errors.Is(err, nats.ErrConnectionClosed) || !strings.Contains(err.Error(), f.stream+"/"+f.durable) {
		t.Fatalf("Run = %v; want nats.ErrConnectionClosed naming the consumer", err)
	}
}

// JetStream disabled for the account (the server still answers, with
// "not enabled for account") ends Run at the next liveness check.
func TestRunEndsWhenJetStreamDisabledForAccount(t *testing.T) {
	t.Parallel()
	// natstest does not hand out its server; this test needs it to
	// disable the account's JetStream.
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{nc: nc, js: js, stream: "ACC", subject: "acc", durable: "work"}
	if _, err := js.CreateStream(testCtx(t), jetstream.StreamConfig{Name: f.stream, Subjects: []string{f.subject + ".>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(testCtx(t), f.stream, jetstream.ConsumerConfig{Durable: f.durable, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 100}); err != nil {
		t.Fatal(err)
	}
	tenant := FromSubjectToken(-1)
	src := f.source(t, WithLivenessCheck(50*time.Millisecond))
	l := newLoop(src, tenant, nil)
	r := consumertest.RunSource(t, src, l)
	f.publish(t, "a", "m1")
	eventually(t, "delivery", func() bool { return l.distinct() == 1 })
	acc, err := srv.LookupAccount(server.DEFAULT_GLOBAL_ACCOUNT)
	if err != nil {
		t.Fatal(err)
	}
	if err := acc.DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	wantGone(t, f, r.Ended(t, 30*time.Second), jetstream.ErrJetStreamNotEnabledForAccount)
}

// A server restart (same port, same store) is transient: Run keeps going,
// says so at Warn, and delivers what is published afterwards.
func TestRunSurvivesServerRestart(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	tenant := FromSubjectToken(-1)
	logs := &logRecorder{}
	src := f.source(t, WithLogger(slog.New(logs)), WithLivenessCheck(50*time.Millisecond))
	l := newLoop(src, tenant, nil)
	r := consumertest.RunSource(t, src, l)
	f.publish(t, "a", "before")
	eventually(t, "delivery", func() bool { return l.distinct() == 1 })
	f.srv.Restart()
	eventually(t, "the outage logged at Warn", func() bool {
		return logs.count("connection lost") > 0 || logs.count("server shutdown") > 0
	})
	r.StillRunning(t, "after the restart")
	f.publishRetry(t, f.subject+".a", "after")
	eventually(t, "delivery after the restart", func() bool { return l.count("a") >= 2 })
	r.StillRunning(t, "after delivering again")
}

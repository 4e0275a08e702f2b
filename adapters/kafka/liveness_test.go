package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

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
	l.mu.Lock()
	l.warns = append(l.warns, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// count counts Warn records whose message contains s.
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
		err      error
		terminal bool
	}{
		{kafkago.SASLAuthenticationFailed, true},
		{fmt.Errorf("SASL handshake failed: %w", kafkago.UnsupportedSASLMechanism), true},
		{kafkago.TopicAuthorizationFailed, true},
		{kafkago.GroupAuthorizationFailed, true},
		{kafkago.ClusterAuthorizationFailed, true},
		{kafkago.InvalidGroupId, true},
		{kafkago.InvalidSessionTimeout, true},
		{errors.Join(errors.New("dial 127.0.0.1:1: refused"), kafkago.TopicAuthorizationFailed), true},
		{kafkago.UnknownTopicOrPartition, false}, // after a grace only
		{kafkago.GroupCoordinatorNotAvailable, false},
		{kafkago.NotCoordinatorForGroup, false},
		{kafkago.RebalanceInProgress, false},
		{kafkago.LeaderNotAvailable, false},
		{kafkago.NotLeaderForPartition, false},
		{kafkago.RequestTimedOut, false},
		{kafkago.InconsistentGroupProtocol, false},
		{errors.New("failed to open connection to 127.0.0.1:1: connection refused"), false},
	}
	for _, tt := range tests {
		if got := terminal(tt.err); got != tt.terminal {
			t.Errorf("terminal(%v) = %v, want %v", tt.err, got, tt.terminal)
		}
	}
}

func TestUnknownTopicIsTerminalAfterItsGrace(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at      time.Duration // after t0
		seen    bool
		wantFor time.Duration
		over    bool
	}{
		{at: 0, wantFor: 0},
		{at: 4 * time.Second, wantFor: 4 * time.Second},
		{seen: true},                      // the streak restarts
		{at: 9 * time.Second, wantFor: 0}, // first unknown after the sighting
		{at: 18 * time.Second, wantFor: 9 * time.Second},
		{at: 19 * time.Second, wantFor: 10 * time.Second, over: true},
	}
	w := topicWatch{grace: 10 * time.Second}
	for i, s := range steps {
		if s.seen {
			w.seen()
			continue
		}
		d, over := w.unknown(t0.Add(s.at))
		if d != s.wantFor || over != s.over {
			t.Fatalf("step %d: unknown = %v, %v; want %v, %v", i, d, over, s.wantFor, s.over)
		}
	}
}

// A topic that never exists ends Run after UnknownTopicTimeout with an
// error naming it.
func TestRunEndsWhenTopicNeverExists(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	topic := uniq("missing")
	src, err := NewSource(c.Addrs(), topic, uniq("g"), fastOpts(WithUnknownTopicTimeout(300*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	r := consumertest.RunSource(t, src, newCollector(false))
	err = r.Ended(t, 30*time.Second)
	if !errors.Is(err, ErrUnknownTopic) || !errors.Is(err, kafkago.UnknownTopicOrPartition) || !strings.Contains(err.Error(), topic) {
		t.Fatalf("Run = %v; want ErrUnknownTopic naming %q", err, topic)
	}
}

// A topic deleted under a running source ends Run, and the engine's Run
// returns the same error.
func TestRunEndsWhenTopicDeleted(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	topic := uniq("deleted")
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	if err := createTopic(testCtx(t, 10*time.Second), cl, topic, 2, -1); err != nil {
		t.Fatal(err)
	}
	produce(t, c.Addrs(), topic, msgs("a", 2, 5)...)
	src, err := NewSource(c.Addrs(), topic, uniq("g"), fastOpts(WithUnknownTopicTimeout(300*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(true)
	col.src = src
	r := consumertest.RunSource(t, src, col)
	col.waitFor(t, testCtx(t, 30*time.Second), "every message", func() bool { return len(col.seen) == 10 })
	resp, err := cl.DeleteTopics(testCtx(t, 10*time.Second), &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
	if err != nil || resp.Errors[topic] != nil {
		t.Fatalf("delete topic: %v %v", err, resp)
	}
	err = r.Ended(t, 30*time.Second)
	if !errors.Is(err, ErrUnknownTopic) || !strings.Contains(err.Error(), topic) {
		t.Fatalf("Run = %v; want ErrUnknownTopic naming %q", err, topic)
	}
}

// A topic created after the source joined is waited for (within the
// grace) and then consumed: the group rebalances to assign it.
func TestRunWaitsForLateTopic(t *testing.T) {
	t.Parallel()
	c := startStrictCluster(t)
	topic := uniq("late")
	logs := &logRecorder{}
	src, err := NewSource(c.Addrs(), topic, uniq("g"), fastOpts(WithUnknownTopicTimeout(time.Minute), WithLogger(slog.New(logs)))...)
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(true)
	col.src = src
	r := consumertest.RunSource(t, src, col)
	ctx := testCtx(t, 60*time.Second)
	eventually(t, ctx, "the source to find the topic missing", func() bool { return logs.count("topic does not exist") > 0 })
	r.StillRunning(t, "while the topic is missing")
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	if err := createTopic(testCtx(t, 10*time.Second), cl, topic, 2, -1); err != nil {
		t.Fatal(err)
	}
	produce(t, c.Addrs(), topic, msgs("a", 2, 5)...)
	col.waitFor(t, ctx, "the late topic's messages", func() bool { return len(col.seen) == 10 })
	r.StillRunning(t, "after the topic appeared")
}

// A broker that is unreachable for longer than the unknown-topic grace is
// retried, with Warn logs, and consumption resumes when it is back.
func TestRunSurvivesBrokerOutage(t *testing.T) {
	t.Parallel()
	topic := uniq("outage")
	c := startStrictCluster(t, kfake.SeedTopics(1, topic), kfake.DataDir(t.TempDir()))
	produce(t, c.Addrs(), topic, msgs("a", 1, 5)...)
	logs := &logRecorder{}
	src, err := NewSource(c.Addrs(), topic, uniq("g"), fastOpts(WithUnknownTopicTimeout(100*time.Millisecond), WithLogger(slog.New(logs)))...)
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(true)
	col.src = src
	r := consumertest.RunSource(t, src, col)
	ctx := testCtx(t, 60*time.Second)
	col.waitFor(t, ctx, "first batch", func() bool { return len(col.seen) == 5 })
	c.Close()
	// Join attempts are 100ms apart: four failures mean the broker was away
	// for longer than the unknown-topic grace.
	eventually(t, ctx, "join retries logged at Warn", func() bool { return logs.count("joining consumer group failed") >= 4 })
	r.StillRunning(t, "while the broker is down")
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	produce(t, c.Addrs(), topic, kafkago.Message{Value: []byte("after")})
	col.waitFor(t, ctx, "a message after the restart", func() bool { return col.seen["after"] > 0 })
	r.StillRunning(t, "after the broker came back")
}

// Credentials, ACLs and a session timeout the broker refuses can never
// work: Run ends at once with the broker's error.
func TestRunEndsOnRefusal(t *testing.T) {
	t.Parallel()
	topic, group := uniq("auth"), uniq("g")
	allow := func(res kmsg.ACLResourceType, name string, ops ...kmsg.ACLOperation) []kfake.ACL {
		var out []kfake.ACL
		for _, op := range ops {
			out = append(out, kfake.ACL{Resource: res, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true})
		}
		return out
	}
	c := startStrictCluster(t,
		kfake.SeedTopics(1, topic),
		kfake.EnableSASL(),
		kfake.EnableACLs(),
		kfake.Superuser("PLAIN", "admin", "admin"),
		kfake.User("PLAIN", "nogroup", "pw", allow(kmsg.ACLResourceTypeTopic, topic, kmsg.ACLOperationRead, kmsg.ACLOperationDescribe)...),
		kfake.User("PLAIN", "notopic", "pw", allow(kmsg.ACLResourceTypeGroup, group, kmsg.ACLOperationRead, kmsg.ACLOperationDescribe)...),
		kfake.GroupMaxSessionTimeout(5*time.Second),
	)
	as := func(user, pass string) SourceOption {
		return WithDialer(&kafkago.Dialer{Timeout: 5 * time.Second, SASLMechanism: plain.Mechanism{Username: user, Password: pass}})
	}
	tests := []struct {
		name string
		opts []SourceOption
		want error
	}{
		{"wrong password", []SourceOption{as("admin", "wrong")}, kafkago.SASLAuthenticationFailed},
		{"no group ACL", []SourceOption{as("nogroup", "pw")}, kafkago.GroupAuthorizationFailed},
		{"no topic ACL", []SourceOption{as("notopic", "pw")}, kafkago.TopicAuthorizationFailed},
		{"session timeout above the broker's max", []SourceOption{as("admin", "admin"), WithSessionTimeout(time.Minute)}, kafkago.InvalidSessionTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src, err := NewSource(c.Addrs(), topic, group, fastOpts(tt.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			r := consumertest.RunSource(t, src, newCollector(false))
			err = r.Ended(t, 30*time.Second)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), topic) {
				t.Fatalf("Run = %v; want %v naming %q", err, tt.want, topic)
			}
		})
	}
}

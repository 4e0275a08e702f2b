package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/consumer"
)

// ErrAlreadyRunning: Run was called a second time on a Source.
var ErrAlreadyRunning = errors.New("kafka: source already running")

// A Source consumes one topic as a member of a Kafka consumer group: a
// consumer.Source. It is safe for concurrent use; Run may be called once.
//
// kafka-go's group Reader merges every partition into one queue and
// commits only the highest offset it was given, so it can neither pause
// one partition nor leave a parked message uncommitted. Source is built on
// kafka-go's lower-level ConsumerGroup and Generation instead: each
// assigned partition is fetched by a goroutine of its own over its own
// connection to the partition's leader (Pause stops that one only, and a
// long poll of one partition holds up no other), and one committer per
// generation commits the engine's watermarks (the lowest unsettled offset
// of each partition) every CommitInterval, on revocation and on shutdown.
//
// A fetcher finds its leader with a Metadata request (which never creates
// the topic), connects as the WithDialer Dialer does (its DialFunc or net
// settings, Resolver, TLS, ClientID and SASL mechanism) and sends Fetch
// requests, reading uncommitted. It decodes the record batches itself:
// each batch's CRC-32C checked, gzip, snappy, lz4 and zstd decompressed,
// transaction markers skipped, null keys, values and header values kept
// apart from empty ones; a topic in the legacy v0/v1 format is an error,
// retried. A leader change, a stale leader epoch or a dropped connection
// closes the connection, and the next try (after a backoff of 100ms
// doubling to 5s) finds the leader again.
//
// Each fetch is handed to the engine with DeliverBatch in slices of at
// most 64 messages, and once the engine pauses the partition the fetcher
// stops after the slice, so the engine's per-partition bounds hold within
// one slice. The rest of the response (at most MaxBytes a paused
// partition) is delivered on Resume before the next fetch, so a pause does
// not make the broker send again what it sent. A slice's messages are
// copied out of the response into one allocation for the messages and one
// for their bytes (values over 4 KiB get their own), so a message the
// engine keeps for long pins at most its slice's small neighbours.
//
// A broker outage is never terminal: the source keeps trying to join the
// group (every JoinBackoff) and to reach each partition leader, and picks
// up a restarted cluster. A member that the group gave no partition checks
// the topic every quarter of UnknownTopicTimeout (at most 5s) and rejoins
// when the topic has partitions no member was given (created after the
// group leader looked), so that the group assigns them.
type Source struct {
	brokers []string
	topic   string
	group   string
	cfg     sourceConfig
	log     *slog.Logger
	client  *kafkago.Client
	watch   topicWatch // how long the topic has been unknown
	fatal   fatal      // the terminal error that ends Run

	started atomic.Bool
	// parts is the current generation's partitions by ID; replaced (never
	// mutated) when a generation starts or ends.
	parts atomic.Pointer[map[int32]*partition]
	// ended is set once the last generation made its final commit on
	// shutdown; later Commit calls commit directly (see lateCommit).
	ended atomic.Bool
	// left is closed when Run has returned and the group was left.
	left chan struct{}
	// lateMu serialises commits made after Run returned.
	lateMu sync.Mutex
}

// partition is one assigned partition within one generation.
type partition struct {
	id    consumer.Partition
	start int64 // offset from the assignment (may be First/LastOffset)

	// want is the highest commit point the engine reported, -1 for none.
	want atomic.Int64
	// done is the last offset committed to the group coordinator. It is
	// owned by the generation's committer, then (after shutdown) guarded by
	// Source.lateMu.
	done int64

	// paused is read lock-free by the fetcher; mu guards wake, which is
	// closed by Resume.
	paused atomic.Bool
	mu     sync.Mutex
	wake   chan struct{}
}

// NewSource returns a Source for topic in consumer group group, reaching the
// cluster through brokers (host:port). It validates its arguments and
// options; nothing connects until Run.
func NewSource(brokers []string, topic, group string, opts ...SourceOption) (*Source, error) {
	if err := validBrokers(brokers); err != nil {
		return nil, err
	}
	if err := validTopic(topic); err != nil {
		return nil, err
	}
	if group == "" {
		return nil, invalid("empty consumer group")
	}
	cfg := defaultSourceConfig()
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil option")
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if len(cfg.clientOpts) > 0 {
		return nil, invalid("WithClientOptions is for a GroupSource; give a Source kafka-go's connection settings with WithDialer")
	}
	s := &Source{
		brokers: append([]string(nil), brokers...),
		topic:   topic,
		group:   group,
		cfg:     cfg,
		log:     cfg.logger.With("topic", topic, "group", group),
		client:  &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: transportFor(cfg.dialer)},
		watch:   topicWatch{grace: cfg.topicGrace},
		left:    make(chan struct{}),
	}
	empty := map[int32]*partition{}
	s.parts.Store(&empty)
	return s, nil
}

// validBrokers checks that there are brokers, each host:port.
func validBrokers(brokers []string) error {
	if len(brokers) == 0 {
		return invalid("no brokers")
	}
	for _, b := range brokers {
		if b == "" || !strings.Contains(b, ":") {
			return invalid("broker %q is not host:port", b)
		}
	}
	return nil
}

// validTopic applies Kafka's topic name rules.
func validTopic(topic string) error {
	if topic == "" || topic == "." || topic == ".." || len(topic) > 249 {
		return invalid("topic %q: must be 1 to 249 characters, not . or ..", topic)
	}
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return invalid("topic %q: character %q not in [a-zA-Z0-9._-]", topic, c)
		}
	}
	return nil
}

// transportFor makes a kafka-go Transport that connects like d.
func transportFor(d *kafkago.Dialer) *kafkago.Transport {
	return &kafkago.Transport{
		Dial:     d.DialFunc,
		SASL:     d.SASLMechanism,
		TLS:      d.TLS,
		ClientID: d.ClientID,
	}
}

// Topic returns the source topic.
func (s *Source) Topic() string { return s.topic }

// Group returns the consumer group.
func (s *Source) Group() string { return s.group }

// Run joins the group and fetches until ctx is cancelled, and returns nil
// then. It returns an error when the source can never work (see the
// package documentation, "Errors"): bad credentials or ACLs, an invalid
// group or session timeout, or a topic that stayed unknown for
// UnknownTopicTimeout. Anything else (brokers down or restarting,
// rebalances) is retried and logged at Warn. On return it has committed
// what was settled and left the group; what the engine settles afterwards
// is still committed by Commit while the group has no other member.
func (s *Source) Run(ctx context.Context, d consumer.Dispatcher) error {
	if !s.started.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer close(s.left)
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.fatal.cancel = cancel
	cg, err := kafkago.NewConsumerGroup(kafkago.ConsumerGroupConfig{
		ID:                s.group,
		Brokers:           s.brokers,
		Dialer:            s.cfg.dialer,
		Topics:            []string{s.topic},
		HeartbeatInterval: s.cfg.heartbeatInterval,
		SessionTimeout:    s.cfg.sessionTimeout,
		RebalanceTimeout:  s.cfg.rebalanceTimeout,
		JoinGroupBackoff:  s.cfg.joinBackoff,
		StartOffset:       s.cfg.startOffset,
		Logger:            s.kafkaLogger(slog.LevelDebug),
		ErrorLogger:       s.kafkaLogger(slog.LevelDebug),
	})
	if err != nil {
		return invalid("consumer group: %v", err)
	}
	// Closing the group (not our goroutines) must end the last generation,
	// so that kafka-go leaves the group instead of joining a new generation.
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = cg.Close()
		close(closed)
	})
	for {
		gen, err := cg.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafkago.ErrGroupClosed) || s.failed(err) {
				break
			}
			s.log.Warn("kafka: joining consumer group failed; retrying", "err", err)
			continue
		}
		if ctx.Err() != nil {
			break
		}
		s.runGeneration(ctx, gen, d)
	}
	if stop() {
		_ = cg.Close()
	} else {
		<-closed
	}
	s.ended.Store(true)
	if parent.Err() != nil {
		return nil
	}
	return s.fatal.get()
}

// runGeneration fetches the generation's partitions and returns once all of
// its goroutines have finished.
func (s *Source) runGeneration(ctx context.Context, gen *kafkago.Generation, d consumer.Dispatcher) {
	parts := make(map[int32]*partition)
	for _, a := range gen.Assignments[s.topic] {
		ps := &partition{id: consumer.Partition{Topic: s.topic, ID: int32(a.ID)}, start: a.Offset, done: -1}
		ps.want.Store(-1)
		parts[ps.id.ID] = ps
	}
	s.log.Debug("kafka: generation started", "generation", gen.ID, "partitions", len(parts))
	s.parts.Store(&parts)
	for _, ps := range parts {
		d.Assigned(ps.id)
	}

	var fetching sync.WaitGroup
	fetching.Add(len(parts))
	finished := make(chan struct{})
	gen.Start(func(genCtx context.Context) {
		defer close(finished)
		s.commitLoop(ctx, genCtx, gen, parts, &fetching, d)
	})
	if len(parts) == 0 {
		gen.Start(func(genCtx context.Context) {
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			defer context.AfterFunc(genCtx, cancel)()
			s.watchTopic(wctx, gen)
		})
	}
	for _, ps := range parts {
		gen.Start(func(genCtx context.Context) {
			fctx, cancel := context.WithCancel(ctx)
			stop := context.AfterFunc(genCtx, cancel)
			s.fetch(fctx, ps, d)
			stop()
			cancel()
			fetching.Done()
			// Returning early would end the generation for everyone.
			<-genCtx.Done()
		})
	}
	<-finished
}

// commitLoop is the generation's single committer.
func (s *Source) commitLoop(ctx, genCtx context.Context, gen *kafkago.Generation, parts map[int32]*partition, fetching *sync.WaitGroup, d consumer.Dispatcher) {
	t := time.NewTicker(s.cfg.commitInterval)
	defer t.Stop()
	for done := false; !done; {
		select {
		case <-t.C:
			s.commitGeneration(gen, parts)
		case <-genCtx.Done():
			done = true
		}
	}
	fetching.Wait() // no Deliver after Revoked
	if ctx.Err() != nil {
		// Shutdown: the engine drains and commits after Run returns.
		s.ended.Store(true)
		s.commitGeneration(gen, parts)
		return
	}
	for _, ps := range parts {
		d.Revoked(ps.id)
	}
	s.commitGeneration(gen, parts)
	empty := map[int32]*partition{}
	s.parts.Store(&empty)
	s.log.Debug("kafka: generation ended", "generation", gen.ID)
}

// commitGeneration commits every watermark that moved since the last
// commit.
func (s *Source) commitGeneration(gen *kafkago.Generation, parts map[int32]*partition) {
	var offsets map[int]int64
	for id, ps := range parts {
		if w := ps.want.Load(); w > ps.done {
			if offsets == nil {
				offsets = make(map[int]int64, len(parts))
			}
			offsets[int(id)] = w
		}
	}
	if offsets == nil {
		return
	}
	if err := gen.CommitOffsets(map[string]map[int]int64{s.topic: offsets}); err != nil {
		// The messages stay uncommitted and are redelivered if the
		// partition moves; the next tick retries.
		if !s.failed(err) {
			s.log.Warn("kafka: commit failed", "generation", gen.ID, "err", err)
		}
		return
	}
	for id, off := range offsets {
		parts[int32(id)].done = off
	}
}

// Settle does nothing: Kafka progress is committed by watermark (Commit).
func (s *Source) Settle(context.Context, *consumer.Message) error { return nil }

// SettleIsNoop reports that Settle does nothing (see consumer.SettleNooper):
// a message is settled by the commit of its partition's watermark.
func (s *Source) SettleIsNoop() bool { return true }

// MessagingSystem implements consumer.SystemNamer: "kafka" in traces.
func (s *Source) MessagingSystem() string { return "kafka" }

var _ consumer.SettleNooper = (*Source)(nil)
var _ consumer.SystemNamer = (*Source)(nil)

// Commit records that every message of p below next is settled. The
// generation's committer sends it within CommitInterval. After Run has
// returned, Commit commits at once (a "simple" commit, accepted while the
// group has no member).
func (s *Source) Commit(ctx context.Context, p consumer.Partition, next int64) error {
	ps := s.lookup(p)
	if ps == nil {
		return nil // revoked: the new owner reads it again
	}
	raiseTo(&ps.want, next)
	if s.ended.Load() {
		return s.lateCommit(ctx, ps)
	}
	return nil
}

// raiseTo sets a to v unless it holds v or more already: a watermark only
// moves up, whatever the order of concurrent stores.
func raiseTo(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// lateCommit commits ps's watermark outside any generation, once the group
// was left.
func (s *Source) lateCommit(ctx context.Context, ps *partition) error {
	select {
	case <-s.left:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.lateMu.Lock()
	defer s.lateMu.Unlock()
	w := ps.want.Load()
	if w <= ps.done {
		return nil
	}
	resp, err := s.client.OffsetCommit(ctx, &kafkago.OffsetCommitRequest{
		Addr:         s.client.Addr,
		GroupID:      s.group,
		GenerationID: -1,
		Topics:       map[string][]kafkago.OffsetCommit{s.topic: {{Partition: int(ps.id.ID), Offset: w}}},
	})
	if err != nil {
		return fmt.Errorf("kafka: commit %s/%d after shutdown: %w", s.topic, ps.id.ID, err)
	}
	for _, pr := range resp.Topics[s.topic] {
		if pr.Error != nil {
			return fmt.Errorf("kafka: commit %s/%d after shutdown: %w", s.topic, ps.id.ID, pr.Error)
		}
	}
	ps.done = w
	return nil
}

func (s *Source) lookup(p consumer.Partition) *partition {
	if p.Topic != s.topic {
		return nil
	}
	return (*s.parts.Load())[p.ID]
}

// Pause stops fetching p after the slice being delivered; Resume goes on
// from the rest of the response that slice came from.
func (s *Source) Pause(p consumer.Partition) {
	if ps := s.lookup(p); ps != nil {
		ps.mu.Lock()
		if !ps.paused.Load() {
			ps.wake = make(chan struct{})
			ps.paused.Store(true)
		}
		ps.mu.Unlock()
	}
}

// Resume undoes Pause.
func (s *Source) Resume(p consumer.Partition) {
	if ps := s.lookup(p); ps != nil {
		ps.mu.Lock()
		if ps.paused.Load() {
			ps.paused.Store(false)
			close(ps.wake)
		}
		ps.mu.Unlock()
	}
}

// waitResumed blocks while ps is paused; false if ctx ended first.
func (ps *partition) waitResumed(ctx context.Context) bool {
	for ps.paused.Load() {
		ps.mu.Lock()
		wake := ps.wake
		paused := ps.paused.Load()
		ps.mu.Unlock()
		if !paused {
			break
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return false
		}
	}
	return ctx.Err() == nil
}

// backoff is the wait before reconnect attempt n (1-based): 100ms doubling
// up to 5s.
func backoff(n int) time.Duration {
	d := 100 * time.Millisecond
	for i := 1; i < n && d < 5*time.Second; i++ {
		d *= 2
	}
	return min(d, 5*time.Second)
}

// sleep waits d or until ctx ends; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// kafkaLogger routes kafka-go's printf logging to slog at level.
func (s *Source) kafkaLogger(level slog.Level) kafkago.Logger {
	return kafkago.LoggerFunc(func(format string, args ...any) {
		if s.log.Enabled(context.Background(), level) {
			s.log.Log(context.Background(), level, "kafka-go: "+fmt.Sprintf(format, args...))
		}
	})
}

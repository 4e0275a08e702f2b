package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer"
)

// A Source consumes a durable JetStream pull consumer for the engine: a
// consumer.Source. See the package documentation. It is safe for
// concurrent use; Run may be called once.
type Source struct {
	js            jetstream.JetStream
	cons          jetstream.Consumer
	opt           sourceOptions
	stream        string
	durable       string
	part          consumer.Partition
	maxAckPending int
	log           *slog.Logger

	mu sync.Mutex // guards the fields below; held for no call out
	// held is the messages the engine holds, by stream sequence, in
	// shards by sequence: Settle, on the engine's workers, takes only its
	// message's shard, so that the consume goroutine does not wait on one
	// lock for the workers' settles. An insert (onMsg) takes mu and then
	// the shard; revokeAll takes mu and then every shard.
	held    [heldShards]heldShard
	paused  bool
	resumed chan struct{} // closed by Resume while paused
	gated   chan struct{} // non-nil while revokeAll runs; closed when it ends
	disp    consumer.Dispatcher
	ran     bool

	acks *acker // sends acks in bursts while Run runs

	dupDropped, extends atomic.Uint64
}

// heldShards is how many shards Source.held has.
const heldShards = 8

type heldShard struct {
	mu sync.Mutex
	m  map[uint64]jetstream.Msg
	_  [48]byte // a shard a line of its own (mu 8 + m 8 + 48 = 64)
}

func (s *Source) heldOf(seq uint64) *heldShard { return &s.held[seq%heldShards] }

// heldMsg is one held message with its stream sequence.
type heldMsg struct {
	seq uint64
	m   jetstream.Msg
}

// appendHeld appends the held messages to dst, shard by shard, and with
// drop forgets them. It takes each shard's lock in turn, for no call out.
func (s *Source) appendHeld(dst []heldMsg, drop bool) []heldMsg {
	for i := range s.held {
		h := &s.held[i]
		h.mu.Lock()
		for seq, m := range h.m {
			dst = append(dst, heldMsg{seq, m})
		}
		if drop {
			clear(h.m)
		}
		h.mu.Unlock()
	}
	return dst
}

// heldCount is how many messages the engine holds now.
func (s *Source) heldCount() int {
	n := 0
	for i := range s.held {
		h := &s.held[i]
		h.mu.Lock()
		n += len(h.m)
		h.mu.Unlock()
	}
	return n
}

var (
	_ consumer.Source            = (*Source)(nil)
	_ consumer.PartitionCapacity = (*Source)(nil)
)

// SourceStats are a Source's counters. Spilling is the engine's: see
// consumer.Stats.
type SourceStats struct {
	// Held is how many of the consumer's messages the engine holds now
	// (delivered, not yet settled).
	Held int
	// Duplicates counts redeliveries dropped because the engine still held
	// the message.
	Duplicates uint64
	// Extends counts rounds of InProgress sent for held messages.
	Extends uint64
	// AcksQueued is how many acks of settled messages wait to be sent
	// (at most about a millisecond: see Settle).
	AcksQueued int
}

// Stats returns the Source's counters.
func (s *Source) Stats() SourceStats {
	st := SourceStats{Held: s.heldCount()}
	st.Duplicates, st.Extends = s.dupDropped.Load(), s.extends.Load()
	st.AcksQueued = s.acks.queued()
	return st
}

// NewSource returns a Source on cons, a durable pull consumer with explicit
// acks. The tenant key is the engine's (consumer.Config.Tenant; e.g.
// FromSubjectToken); the Source does not need it.
func NewSource(ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer, opts ...SourceOption) (*Source, error) {
	if js == nil || cons == nil {
		return nil, fmt.Errorf("%w: nil JetStream or consumer", ErrInvalidOption)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("nats: consumer info: %w", err)
	}
	cfg := info.Config
	switch {
	case cfg.AckPolicy != jetstream.AckExplicitPolicy:
		return nil, fmt.Errorf("%w: ack policy %v, want explicit", ErrConsumerConfig, cfg.AckPolicy)
	case cfg.Durable == "":
		return nil, fmt.Errorf("%w: not durable", ErrConsumerConfig)
	}
	o := sourceOptions{
		extendEvery: cfg.AckWait / 3,
		pullMax:     500,
		logger:      slog.Default(),
		liveness:    5 * time.Second,
	}
	if o.extendEvery <= 0 {
		o.extendEvery = 10 * time.Second
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil source option", ErrInvalidOption)
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if cfg.AckWait > 0 && o.extendEvery >= cfg.AckWait {
		return nil, fmt.Errorf("%w: extend interval %v must be below AckWait %v", ErrInvalidOption, o.extendEvery, cfg.AckWait)
	}
	src := &Source{
		js:            js,
		cons:          cons,
		opt:           o,
		stream:        info.Stream,
		durable:       cfg.Durable,
		part:          homePartition(info.Stream, cfg.Durable),
		maxAckPending: cfg.MaxAckPending,
		log:           o.logger.With("stream", info.Stream, "durable", cfg.Durable),
		acks:          newAcker(o.logger.With("stream", info.Stream, "durable", cfg.Durable)),
	}
	for i := range src.held {
		src.held[i].m = make(map[uint64]jetstream.Msg)
	}
	return src, nil
}

// Open looks up the durable consumer on stream and returns a Source on it.
// When the server has no JetStream it fails with an error wrapping
// ErrCoreNATS.
func Open(ctx context.Context, nc *nats.Conn, stream, durable string, opts ...SourceOption) (*Source, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	cons, err := js.Consumer(ctx, stream, durable)
	if err != nil {
		if noJetStream(err) {
			return nil, fmt.Errorf("%w (%v)", ErrCoreNATS, err)
		}
		return nil, fmt.Errorf("nats: consumer %s/%s: %w", stream, durable, err)
	}
	return NewSource(ctx, js, cons, opts...)
}

// SpillLog opens the spill log of the Source's consumer (NewSpillLog on its
// stream and durable), for consumer.Config.Spill.
func (s *Source) SpillLog(ctx context.Context, opts ...SpillOption) (*SpillLog, error) {
	opts = append([]SpillOption{WithSpillLogger(s.opt.logger)}, opts...)
	return NewSpillLog(ctx, s.js, s.stream, s.durable, opts...)
}

// MaxUnsettled implements consumer.PartitionCapacity: the consumer's
// MaxAckPending, past which the server stops delivering. The engine keeps
// its per-partition bound below it, so a stuck tenant spills before the
// consumer stalls (0: unlimited).
func (s *Source) MaxUnsettled(p consumer.Partition) int {
	if p != s.part || s.maxAckPending < 0 {
		return 0
	}
	return s.maxAckPending
}

// noJetStream reports whether err says the server has no JetStream. A
// server without it has no responder for the $JS API at all.
func noJetStream(err error) bool {
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.Is(err, nats.ErrNoResponders)
}

// JetStream returns the JetStream context the Source uses, e.g. to open a
// DLQ on the same connection.
func (s *Source) JetStream() jetstream.JetStream { return s.js }

// Partition is the engine partition of the consumer's own messages.
func (s *Source) Partition() consumer.Partition { return s.part }

// Run consumes until ctx is cancelled, and returns nil then. It returns an
// error when the consumer can never deliver again: the error wraps
// ErrConsumerGone when the durable, its stream or the account's JetStream
// is gone, and nats.ErrConnectionClosed when the connection was closed (see
// the package documentation, "Errors"). Transient faults are retried and
// logged at Warn.
func (s *Source) Run(ctx context.Context, d consumer.Dispatcher) error {
	s.mu.Lock()
	if s.ran {
		s.mu.Unlock()
		return errors.New("nats: Source.Run called twice")
	}
	s.ran = true
	s.disp = d
	s.mu.Unlock()

	d.Assigned(s.part)

	var wg sync.WaitGroup
	defer wg.Wait() // runs after cancel
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { s.extendLoop(ctx) })
	s.acks.start()
	wg.Go(func() { s.acks.run(ctx) }) // sends what is queued once ctx ends

	live := newLiveness()
	cc, err := s.cons.Consume(func(msg jetstream.Msg) { s.onMsg(ctx, d, msg) },
		jetstream.PullMaxMessages(s.opt.pullMax),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { s.onConsumeErr(live, err) }))
	if err != nil {
		return fmt.Errorf("nats: consume: %w", err)
	}
	err = s.watch(ctx, cc, live)
	cancel() // a consume callback blocked by Pause returns
	cc.Stop()
	<-cc.Closed()
	return err
}

// onMsg runs on the consume goroutine, one message at a time, and hands
// each to the engine with Deliver. Batching them for DeliverBatch would
// take a staging goroutine (a hop and a second buffer) for no gain in
// BenchmarkConsume.
func (s *Source) onMsg(ctx context.Context, d consumer.Dispatcher, msg jetstream.Msg) {
	seq, ts, ok := ackSeqTime(msg.Reply())
	if !ok { // not the ack subject layout we know: let nats.go parse it
		md, err := msg.Metadata()
		if err != nil {
			s.log.Warn("ringfence nats: message without JetStream metadata", "subject", msg.Subject(), "err", err)
			return
		}
		seq, ts = md.Sequence.Stream, md.Timestamp.UnixNano()
	}
	m := &consumer.Message{
		Value:     msg.Data(),
		Headers:   fromNATSHeader(msg.Headers()),
		Topic:     msg.Subject(),
		Partition: s.part,
		Offset:    int64(seq),
		Stream:    s.stream,
		Time:      time.Unix(0, ts),
		Handle:    msg,
	}
	for {
		s.mu.Lock()
		if !s.paused && s.gated == nil {
			break
		}
		ch := s.resumed
		if s.gated != nil {
			ch = s.gated
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return // not acked: redelivered after AckWait
		}
	}
	if ctx.Err() != nil {
		s.mu.Unlock()
		return
	}
	h := s.heldOf(seq)
	h.mu.Lock()
	if _, dup := h.m[seq]; dup {
		// A redelivery of a message the engine still holds (e.g. AckWait
		// expired while the consume callback was blocked by Pause).
		h.mu.Unlock()
		s.mu.Unlock()
		s.dupDropped.Add(1)
		return
	}
	h.m[seq] = msg
	h.mu.Unlock()
	s.mu.Unlock()
	d.Deliver(m)
}

// Settle acks a message the engine handled, dead-lettered or spilled.
// While Run runs the ack is queued and sent within about a millisecond,
// back to back with the other acks of that moment (see acker: acks sent one
// by one contend with the server's delivery loop); before Run and after it
// returned, and with WithDoubleAck, it is sent before Settle returns.
func (s *Source) Settle(ctx context.Context, m *consumer.Message) error {
	h, ok := m.Handle.(jetstream.Msg)
	if !ok {
		return fmt.Errorf("nats: Settle: message handle %T is not from this source", m.Handle)
	}
	hs := s.heldOf(uint64(m.Offset))
	hs.mu.Lock()
	delete(hs.m, uint64(m.Offset))
	hs.mu.Unlock()
	if s.opt.doubleAck {
		return h.DoubleAck(ctx)
	}
	if s.acks.add(h) {
		return nil
	}
	return h.Ack()
}

// Commit does nothing: JetStream acks each message in Settle.
func (s *Source) Commit(context.Context, consumer.Partition, int64) error { return nil }

// MessagingSystem implements consumer.SystemNamer: "nats" in traces.
func (s *Source) MessagingSystem() string { return "nats" }

var _ consumer.SystemNamer = (*Source)(nil)

// Pause stops handing messages of p to the engine: it blocks the consume
// callback (messages nats.go already buffered wait in the client).
func (s *Source) Pause(p consumer.Partition) {
	if p != s.part {
		return
	}
	s.mu.Lock()
	if !s.paused {
		s.paused = true
		s.resumed = make(chan struct{})
	}
	s.mu.Unlock()
}

// Resume undoes Pause.
func (s *Source) Resume(p consumer.Partition) {
	if p != s.part {
		return
	}
	s.mu.Lock()
	if s.paused {
		s.paused = false
		close(s.resumed)
	}
	s.mu.Unlock()
}

// extendLoop keeps the messages the engine holds (in its lanes or parked)
// from reaching AckWait: every extendEvery it sends InProgress for each.
func (s *Source) extendLoop(ctx context.Context) {
	t := time.NewTicker(s.opt.extendEvery)
	defer t.Stop()
	var batch []heldMsg
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		batch = s.appendHeld(batch[:0], false)
		for _, h := range batch {
			_ = h.m.InProgress() // best effort; a miss means a redelivery, never a loss
		}
		clear(batch)
		s.extends.Add(1)
	}
}

// ackSeqTime reads the stream sequence and timestamp from a JetStream ack
// subject without allocating (jetstream.Msg.Metadata allocates). Layouts,
// as in nats.go's parser:
//
//	v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>
//	v2: $JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>[.<token>]
func ackSeqTime(reply string) (seq uint64, ts int64, ok bool) {
	// One pass for the dots, then the two numbers by hand: this runs on
	// the consume goroutine, where every message waits for the one before
	// (BenchmarkConsume guards it).
	const prefix = "$JS.ACK."
	if len(reply) < len(prefix) || reply[:len(prefix)] != prefix {
		return 0, 0, false
	}
	var dots [12]int // where the first 12 dots are
	n := 0
	for i := 0; i < len(reply); i++ {
		if reply[i] == '.' {
			if n < len(dots) {
				dots[n] = i
			}
			n++
		}
	}
	var seqTok, tmTok int
	switch tokens := n + 1; {
	case tokens == 9:
		seqTok, tmTok = 5, 7
	case tokens >= 11:
		seqTok, tmTok = 7, 9
	default:
		return 0, 0, false
	}
	token := func(i int) string { // i >= 1; a dot follows token i (tmTok < n)
		return reply[dots[i-1]+1 : dots[i]]
	}
	seq, ok1 := digits(token(seqTok))
	tm, ok2 := digits(token(tmTok))
	return seq, int64(tm), ok1 && ok2 && seq > 0
}

// digits parses a decimal number of 1 to 19 digits (so no uint64
// overflow), and nothing else.
func digits(s string) (uint64, bool) {
	if len(s) == 0 || len(s) > 19 {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		d := s[i] - '0'
		if d > 9 {
			return 0, false
		}
		v = v*10 + uint64(d)
	}
	return v, true
}

func fromNATSHeader(h nats.Header) []consumer.Header {
	if len(h) == 0 {
		return nil
	}
	keys := make([]string, 0, len(h))
	n := 0
	for k, v := range h {
		keys = append(keys, k)
		n += len(v)
	}
	slices.Sort(keys)
	out := make([]consumer.Header, 0, n)
	for _, k := range keys {
		for _, v := range h[k] {
			out = append(out, consumer.Header{Key: k, Value: []byte(v)})
		}
	}
	return out
}

// revokeAll takes the partition away from the engine and gives it back,
// as a consumer-group rebalance would: the engine drops what it buffered
// and parked, and the Source naks the messages the engine held (the server
// redelivers them, in order). The conformance suite's Revocation case
// drives it.
func (s *Source) revokeAll() {
	s.mu.Lock()
	d := s.disp
	if d == nil || s.gated != nil {
		s.mu.Unlock()
		return
	}
	s.gated = make(chan struct{})
	held := s.appendHeld(nil, true)
	s.mu.Unlock()
	slices.SortFunc(held, func(a, b heldMsg) int { return cmp.Compare(a.seq, b.seq) })

	d.Revoked(s.part)
	for _, h := range held {
		_ = h.m.Nak() // redelivered at once; a lost nak waits for AckWait
	}
	d.Assigned(s.part)

	s.mu.Lock()
	close(s.gated)
	s.gated = nil
	s.mu.Unlock()
}

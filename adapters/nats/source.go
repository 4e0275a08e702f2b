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
	held [heldShards]heldShard
	// paused holds the paused partitions, each with the channel Resume
	// closes.
	paused map[consumer.Partition]chan struct{}
	gated  chan struct{} // non-nil while revokeAll runs; closed when it ends
	disp   consumer.Dispatcher
	ran    bool

	acks *acker // sends acks in bursts while Run runs

	// parts is the partitions the Source reports: its home partition, or
	// a group member's partitions.
	parts []consumer.Partition
	// group is the consumer group the Source is a member of; nil for a
	// plain durable.
	group *groupSpec
	// pinGroup is the priority group a pinned consumer is pulled in; ""
	// when the consumer does not pin a client.
	pinGroup   string
	pullExpiry time.Duration
	// Pin state of a pinned consumer, used only by the consume goroutine
	// (and by Run once consuming stopped): the current pin, whether the
	// engine was told the partitions are ours, recent pins lost.
	pin      string
	owning   bool
	unfed    []heldMsg // delivered while Run ended, never given to the engine
	lostPins [4]string
	lostNext int

	owned                           atomic.Bool
	dupDropped, extends, pinChanges atomic.Uint64
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
	// Owning says whether the Source owns its partitions now: always
	// while a plain durable's Run runs; for a pinned consumer (a group
	// member, WithPinnedClient), while this process is the pinned one.
	Owning bool
	// Pinned counts the times a pinned consumer's Source became the owner.
	Pinned uint64
}

// Stats returns the Source's counters.
func (s *Source) Stats() SourceStats {
	st := SourceStats{Held: s.heldCount()}
	st.Duplicates, st.Extends = s.dupDropped.Load(), s.extends.Load()
	st.AcksQueued = s.acks.queued()
	st.Owning, st.Pinned = s.owned.Load(), s.pinChanges.Load()
	return st
}

// NewSource returns a Source on cons, a durable pull consumer with explicit
// acks. The tenant key is the engine's (consumer.Config.Tenant; e.g.
// FromSubjectToken); the Source does not need it. A durable that is a
// pinned-client priority group (see WithPinnedClient) is consumed as one:
// of several processes, only the pinned one owns its partition.
func NewSource(ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer, opts ...SourceOption) (*Source, error) {
	o, err := buildSourceOptions(opts)
	if err != nil {
		return nil, err
	}
	if o.group != "" {
		return nil, fmt.Errorf("%w: WithConsumerGroup needs Open, which makes the member's consumer", ErrInvalidOption)
	}
	return newSource(ctx, js, cons, o, nil)
}

func buildSourceOptions(opts []SourceOption) (sourceOptions, error) {
	o := sourceOptions{pullMax: 500, logger: slog.Default(), liveness: 5 * time.Second}
	for _, opt := range opts {
		if opt == nil {
			return o, fmt.Errorf("%w: nil source option", ErrInvalidOption)
		}
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

func newSource(ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer, o sourceOptions, g *groupSpec) (*Source, error) {
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
	pinGroup := ""
	switch {
	case g != nil:
		pinGroup = groupPriority
	case o.pin || cfg.PriorityPolicy != jetstream.PriorityPolicyNone:
		if pinGroup, err = pinDurable(ctx, js, info); err != nil {
			return nil, err
		}
		// nats.go checks a pull's priority group against the consumer's
		// cached info: take the updated one.
		if cons, err = js.Consumer(ctx, info.Stream, cfg.Durable); err != nil {
			return nil, fmt.Errorf("nats: consumer %s/%s: %w", info.Stream, cfg.Durable, err)
		}
	}
	if o.extendEvery == 0 {
		o.extendEvery = cfg.AckWait / 3
		if o.extendEvery <= 0 {
			o.extendEvery = 10 * time.Second
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
		paused:        make(map[consumer.Partition]chan struct{}),
		group:         g,
		pinGroup:      pinGroup,
		pullExpiry:    max(cfg.AckWait/2, time.Second),
	}
	src.parts = []consumer.Partition{src.part}
	if g != nil {
		src.part = consumer.Partition{Topic: g.topic, ID: -1} // no message is on it
		src.parts = src.parts[:0]
		for _, id := range g.parts {
			src.parts = append(src.parts, consumer.Partition{Topic: g.topic, ID: id})
		}
		src.log = src.log.With("group", g.name, "member", g.member)
	}
	for i := range src.held {
		src.held[i].m = make(map[uint64]jetstream.Msg)
	}
	return src, nil
}

// Open looks up the durable consumer on stream and returns a Source on it.
// With WithConsumerGroup, durable must be "": Open joins the group as its
// member instead (see WithConsumerGroup). When the server has no JetStream
// it fails with an error wrapping ErrCoreNATS.
func Open(ctx context.Context, nc *nats.Conn, stream, durable string, opts ...SourceOption) (*Source, error) {
	o, err := buildSourceOptions(opts)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	if o.group != "" {
		if durable != "" {
			return nil, fmt.Errorf("%w: durable %q given with WithConsumerGroup; pass \"\" (the member's consumer is \"<group>-<member>\")", ErrInvalidOption, durable)
		}
		cons, g, err := joinGroup(ctx, js, stream, &o)
		if err != nil {
			return nil, err
		}
		return newSource(ctx, js, cons, o, g)
	}
	cons, err := js.Consumer(ctx, stream, durable)
	if err != nil {
		if noJetStream(err) {
			return nil, fmt.Errorf("%w (%v)", ErrCoreNATS, err)
		}
		return nil, fmt.Errorf("nats: consumer %s/%s: %w", stream, durable, err)
	}
	return newSource(ctx, js, cons, o, nil)
}

// SpillLog opens the spill log of the Source's consumer (NewSpillLog on its
// stream and durable), for consumer.Config.Spill. A group member's is the
// group's (NewSpillLog on the stream and the group's name), shared by its
// members: each partition's lanes have subjects of their own, appended and
// re-fed only by the partition's owner.
func (s *Source) SpillLog(ctx context.Context, opts ...SpillOption) (*SpillLog, error) {
	opts = append([]SpillOption{WithSpillLogger(s.opt.logger)}, opts...)
	if s.group != nil {
		return NewSpillLog(ctx, s.js, s.stream, s.group.name, opts...)
	}
	return NewSpillLog(ctx, s.js, s.stream, s.durable, opts...)
}

// MaxUnsettled implements consumer.PartitionCapacity: the consumer's
// MaxAckPending, past which the server stops delivering, shared evenly by
// a group member's partitions. The engine keeps its per-partition bound
// below it, so a stuck tenant spills before the consumer stalls (0:
// unlimited).
func (s *Source) MaxUnsettled(p consumer.Partition) int {
	if !slices.Contains(s.parts, p) || s.maxAckPending <= 0 {
		return 0
	}
	return max(s.maxAckPending/len(s.parts), 1)
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

// Partition is the engine partition of a plain durable's messages.
func (s *Source) Partition() consumer.Partition { return s.part }

// Partitions are the engine partitions the Source reports: a plain
// durable's one, or a group member's.
func (s *Source) Partitions() []consumer.Partition { return slices.Clone(s.parts) }

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

	if s.pinGroup == "" {
		d.Assigned(s.part)
		s.owned.Store(true)
		defer s.owned.Store(false)
	}

	var wg sync.WaitGroup
	defer wg.Wait() // runs after cancel
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { s.extendLoop(ctx) })
	s.acks.start()
	wg.Go(func() { s.acks.run(ctx) }) // sends what is queued once ctx ends

	live := newLiveness()
	if s.group != nil {
		if err := s.watchGroup(ctx, live); err != nil {
			return err
		}
	}
	copts := []jetstream.PullConsumeOpt{
		jetstream.PullMaxMessages(s.opt.pullMax),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			// Status errors reach here on the consume goroutine, in
			// order with the messages, so the pin state needs no lock.
			if s.pinGroup != "" && errors.Is(err, jetstream.ErrPinIDMismatch) {
				s.lostPin(d)
				return
			}
			s.onConsumeErr(live, err)
		}),
	}
	if s.pinGroup != "" {
		// A pull at least every half AckWait keeps the pin (PinnedTTL is
		// twice AckWait), as pcgroups' own consumers do.
		copts = append(copts, jetstream.PullPriorityGroup(s.pinGroup), jetstream.PullExpiry(s.pullExpiry))
	}
	cc, err := s.cons.Consume(func(msg jetstream.Msg) { s.onMsg(ctx, d, msg) }, copts...)
	if err != nil {
		return fmt.Errorf("nats: consume: %w", err)
	}
	err = s.watch(ctx, cc, live)
	cancel() // a consume callback blocked by Pause returns
	if s.pinGroup != "" {
		// Drain: what the client buffered comes to onMsg, which keeps it
		// for stepDown to hand back in order with what the engine held.
		cc.Drain()
	} else {
		cc.Stop()
	}
	<-cc.Closed()
	if s.pinGroup != "" {
		s.stepDown(d)
	}
	return err
}

// unhanded keeps a message that reached onMsg once Run was ending. A
// pinned Source hands it back (stepDown); any other leaves it to AckWait.
func (s *Source) unhanded(seq uint64, msg jetstream.Msg) {
	if s.pinGroup != "" {
		s.unfed = append(s.unfed, heldMsg{seq, msg})
	}
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
	subject, part := msg.Subject(), s.part
	if s.group != nil {
		var ok bool
		if part, subject, ok = s.group.split(subject); !ok {
			s.log.Warn("ringfence nats: message without a partition token; handed back", "subject", msg.Subject())
			_ = msg.NakWithDelay(s.opt.extendEvery)
			return
		}
	}
	if s.pinGroup != "" && ctx.Err() != nil {
		s.unhanded(seq, msg) // stopping: drained from the client's buffer
		return
	}
	if s.pinGroup != "" && !s.claim(d, msg) {
		return
	}
	m := &consumer.Message{
		Value:     msg.Data(),
		Headers:   fromNATSHeader(msg.Headers()),
		Topic:     subject,
		Partition: part,
		Offset:    int64(seq),
		Stream:    s.stream,
		Time:      time.Unix(0, ts),
		Handle:    msg,
	}
	for {
		s.mu.Lock()
		ch, paused := s.paused[part]
		if !paused && s.gated == nil {
			break
		}
		if s.gated != nil {
			ch = s.gated
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			s.unhanded(seq, msg)
			return
		}
	}
	if ctx.Err() != nil {
		s.mu.Unlock()
		s.unhanded(seq, msg)
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

// Pause stops handing messages of p to the engine: the consume callback
// blocks at p's next message (messages nats.go already buffered wait in
// the client). A group member's partitions share one consumer, so a
// message of a paused partition holds back the member's others behind it.
func (s *Source) Pause(p consumer.Partition) {
	if !slices.Contains(s.parts, p) {
		return
	}
	s.mu.Lock()
	if _, ok := s.paused[p]; !ok {
		s.paused[p] = make(chan struct{})
	}
	s.mu.Unlock()
}

// Resume undoes Pause.
func (s *Source) Resume(p consumer.Partition) {
	s.mu.Lock()
	if ch, ok := s.paused[p]; ok {
		delete(s.paused, p)
		close(ch)
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
		if k == pinHeader { // the server's, for this delivery only
			continue
		}
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
	if d == nil || s.gated != nil || s.pinGroup != "" {
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

package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// Headers a spilled message carries in the park stream. They are removed
// before the message is handed to the engine again.
const (
	hdrParkTenant  = "ringfence-park-tenant"
	hdrParkSubject = "ringfence-park-subject"
	hdrParkSeq     = "ringfence-park-seq"
	hdrParkTime    = "ringfence-park-time"
	hdrParkPrefix  = "ringfence-park-"
	// hdrParkNats prefixes the original's "Nats-" headers, which the park
	// stream would otherwise act on (Nats-Msg-Id, Nats-Expected-*, Nats-TTL).
	hdrParkNats = "ringfence-park-h-"
)

// Source feeds the ringfence engine from a durable JetStream pull consumer.
// See the package documentation for how it parks without stalling the
// consumer. It is safe for concurrent use; Run may be called once.
type Source struct {
	js      jetstream.JetStream
	cons    jetstream.Consumer
	tenant  consumer.TenantFunc
	opt     sourceOptions
	stream  string
	durable string
	part    consumer.Partition
	park    jetstream.Stream
	log     *slog.Logger

	wake chan struct{} // nudges the re-feeder; capacity 1

	mu       sync.Mutex
	held     map[uint64]heldMsg      // main-partition messages the engine holds, by stream sequence
	tenants  map[string]*tenantState // tenants with held or spilled messages
	parkPart map[consumer.Partition]*tenantState
	paused   bool
	resumed  chan struct{} // closed by Resume while paused
	gated    chan struct{} // non-nil while revokeAll runs; closed when it ends
	disp     consumer.Dispatcher
	ran      bool
	sweepAt  int // tenants count that triggers a sweep of idle ones

	spilledTotal, refedTotal, dupDropped, extends atomic.Uint64
}

// SourceStats are a Source's counters.
type SourceStats struct {
	// Held is how many of the consumer's messages the engine holds now.
	Held int
	// Spilling is how many tenants are spilling to the park stream now.
	Spilling int
	// Spilled and Refed count messages moved to and back from the park
	// stream since the Source was made.
	Spilled, Refed uint64
	// Duplicates counts redeliveries dropped because the engine still held
	// the message.
	Duplicates uint64
	// Extends counts rounds of InProgress sent for held messages.
	Extends uint64
}

// Stats returns the Source's counters.
func (s *Source) Stats() SourceStats {
	s.mu.Lock()
	st := SourceStats{Held: len(s.held)}
	for _, t := range s.tenants {
		if t.spilling {
			st.Spilling++
		}
	}
	s.mu.Unlock()
	st.Spilled, st.Refed, st.Duplicates = s.spilledTotal.Load(), s.refedTotal.Load(), s.dupDropped.Load()
	st.Extends = s.extends.Load()
	return st
}

type heldMsg struct {
	msg    jetstream.Msg
	tenant string
}

// tenantState is one tenant's share of the source. Guarded by Source.mu.
type tenantState struct {
	key      string
	heldMain int // delivered from the consumer, not yet settled
	// overSince is when the tenant last reached its limit or, at or over
	// it, last settled a message; zero when it never reached the limit.
	overSince time.Time
	heldPark  int // re-fed from the park stream, not yet settled

	spilling   bool   // new messages go to the park stream until it is drained
	spillBusy  bool   // a spill publish is in flight
	spilled    uint64 // messages stored in the park stream (this run and before)
	refed      uint64 // of those, handed to the engine again
	cursor     uint64 // next park stream sequence to look at
	part       consumer.Partition
	assigned   bool
	parkPaused bool
	// inflightPark holds the park sequences re-fed and not yet settled, in
	// order; purgedBelow is the park sequence below which the tenant's
	// subject has been purged.
	inflightPark []uint64
	purgedBelow  uint64
}

// parkedMsg is the Handle of a message re-fed from the park stream.
type parkedMsg struct {
	seq     uint64 // in the park stream
	origSeq uint64 // in the consumer's stream
	tenant  string
}

// NewSource returns a Source on cons, a durable pull consumer with explicit
// acks. tenant extracts the tenant key; it should be the engine's own
// TenantFunc. The park stream is created if missing.
func NewSource(ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer, tenant consumer.TenantFunc, opts ...SourceOption) (*Source, error) {
	if js == nil || cons == nil || tenant == nil {
		return nil, fmt.Errorf("%w: nil JetStream, consumer or tenant func", ErrInvalidOption)
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
	case cfg.MaxAckPending < 2:
		return nil, fmt.Errorf("%w: MaxAckPending %d: need at least 2 (unlimited is not supported: the tenant limit derives from it)", ErrConsumerConfig, cfg.MaxAckPending)
	}
	o := sourceOptions{
		tenantLimit:  max(1, cfg.MaxAckPending/16),
		parkStream:   "RINGFENCE_PARK_" + info.Stream + "_" + cfg.Durable,
		parkPrefix:   "ringfence.park." + info.Stream + "." + cfg.Durable,
		extendEvery:  cfg.AckWait / 3,
		pullMax:      500,
		logger:       slog.Default(),
		spillBackoff: 50 * time.Millisecond,
		spillAfter:   250 * time.Millisecond,
		liveness:     5 * time.Second,
	}
	if o.extendEvery <= 0 {
		o.extendEvery = 10 * time.Second
	}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.tenantLimit >= cfg.MaxAckPending {
		return nil, fmt.Errorf("%w: tenant limit %d must be below MaxAckPending %d", ErrInvalidOption, o.tenantLimit, cfg.MaxAckPending)
	}
	if cfg.AckWait > 0 && o.extendEvery >= cfg.AckWait {
		return nil, fmt.Errorf("%w: extend interval %v must be below AckWait %v", ErrInvalidOption, o.extendEvery, cfg.AckWait)
	}
	park, err := ensureStream(ctx, js, o.parkStream, o.parkPrefix)
	if err != nil {
		return nil, err
	}
	s := &Source{
		js:       js,
		cons:     cons,
		tenant:   tenant,
		opt:      o,
		stream:   info.Stream,
		durable:  cfg.Durable,
		part:     consumer.Partition{Topic: info.Stream + "/" + cfg.Durable},
		park:     park,
		log:      o.logger.With("stream", info.Stream, "durable", cfg.Durable),
		wake:     make(chan struct{}, 1),
		held:     make(map[uint64]heldMsg),
		tenants:  make(map[string]*tenantState),
		parkPart: make(map[consumer.Partition]*tenantState),
		sweepAt:  minTenantSweep,
	}
	return s, nil
}

// Open looks up the durable consumer on stream and returns a Source on it.
// When the server has no JetStream it fails with an error wrapping
// ErrCoreNATS.
func Open(ctx context.Context, nc *nats.Conn, stream, durable string, tenant consumer.TenantFunc, opts ...SourceOption) (*Source, error) {
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
	return NewSource(ctx, js, cons, tenant, opts...)
}

// noJetStream reports whether err says the server has no JetStream. A
// server without it has no responder for the $JS API at all.
func noJetStream(err error) bool {
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.Is(err, nats.ErrNoResponders)
}

// ensureStream returns the stream, creating it with file storage and the
// subjects "<prefix>.>" if it does not exist.
func ensureStream(ctx context.Context, js jetstream.JetStream, name, prefix string) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:     name,
			Subjects: []string{prefix + ".>"},
			Storage:  jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // lost a creation race
			st, err = js.Stream(ctx, name)
		}
	}
	switch {
	case noJetStream(err):
		return nil, fmt.Errorf("%w (%v)", ErrCoreNATS, err)
	case err != nil:
		return nil, fmt.Errorf("nats: stream %s: %w", name, err)
	}
	if !slices.Contains(st.CachedInfo().Config.Subjects, prefix+".>") {
		return nil, fmt.Errorf("%w: stream %s does not take subjects %s.>", ErrInvalidOption, name, prefix)
	}
	return st, nil
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

	if err := s.recoverSpills(ctx); err != nil {
		return err
	}
	d.Assigned(s.part)

	var wg sync.WaitGroup
	defer wg.Wait() // runs after cancel
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { s.extendLoop(ctx) })
	wg.Go(func() { s.refeedLoop(ctx, d) })
	s.nudge() // re-feed tenants recovered from the park stream at once

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

// onMsg runs on the consume goroutine, one message at a time.
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
	tenant, err := s.tenant(m)
	if err != nil {
		tenant = "" // one shared bucket for keyless messages
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
	if _, dup := s.held[seq]; dup {
		// A redelivery of a message the engine still holds (e.g. AckWait
		// expired while the consume callback was blocked by Pause).
		s.mu.Unlock()
		s.dupDropped.Add(1)
		return
	}
	st := s.tenantLocked(tenant)
	if n := st.heldMain + st.heldPark; n >= s.opt.tenantLimit && !st.spilling {
		// At the limit: spill only a tenant that has made no progress for
		// spillAfter (parked, or stuck retrying). A busy tenant that keeps
		// settling goes over the limit instead of paying a second write.
		now := time.Now()
		if n == s.opt.tenantLimit && st.overSince.IsZero() {
			st.overSince = now
		}
		if now.Sub(st.overSince) >= s.opt.spillAfter || n >= hardLimitFactor*s.opt.tenantLimit {
			st.spilling = true
		}
	}
	if st.spilling {
		st.spillBusy = true
		s.mu.Unlock()
		ok := s.spill(ctx, msg, seq, m.Time, tenant)
		s.mu.Lock()
		st.spillBusy = false
		if ok {
			st.spilled++
			s.spilledTotal.Add(1)
		}
		s.mu.Unlock()
		s.nudge()
		return
	}
	st.heldMain++
	if st.heldMain+st.heldPark == s.opt.tenantLimit {
		st.overSince = time.Now()
	}
	s.held[seq] = heldMsg{msg: msg, tenant: tenant}
	s.mu.Unlock()
	d.Deliver(m)
}

func (s *Source) tenantLocked(tenant string) *tenantState {
	st := s.tenants[tenant]
	if st == nil {
		if len(s.tenants) >= s.sweepAt {
			for _, t := range s.tenants {
				s.dropIfIdleLocked(t)
			}
			s.sweepAt = max(minTenantSweep, 2*len(s.tenants))
		}
		st = &tenantState{key: tenant}
		s.tenants[tenant] = st
	}
	return st
}

// hardLimitFactor caps a busy tenant: past hardLimitFactor times the tenant
// limit it spills even while it keeps settling.
const hardLimitFactor = 4

// minTenantSweep is how many tenants the Source tracks before it forgets
// idle ones.
const minTenantSweep = 1024

// dropIfIdleLocked forgets a tenant that holds and parks nothing.
func (s *Source) dropIfIdleLocked(st *tenantState) {
	if !st.spilling && st.heldMain == 0 && st.heldPark == 0 && !st.assigned {
		delete(s.tenants, st.key)
	}
}

// spill stores msg in its tenant's park subject and, once the server
// acknowledged that, acks the original. It retries until ctx ends; false
// means the message was not stored and stays unacked (redelivered later).
func (s *Source) spill(ctx context.Context, msg jetstream.Msg, seq uint64, ts time.Time, tenant string) bool {
	h := make(nats.Header, len(msg.Headers())+4)
	for k, v := range msg.Headers() {
		if strings.HasPrefix(k, "Nats-") {
			k = hdrParkNats + k
		}
		h[k] = v
	}
	h[hdrParkTenant] = []string{tenant}
	h[hdrParkSubject] = []string{msg.Subject()}
	h[hdrParkSeq] = []string{strconv.FormatUint(seq, 10)}
	h[hdrParkTime] = []string{ts.UTC().Format(time.RFC3339Nano)}
	// The park stream drops a second copy (a retried publish, or a
	// redelivery after a lost ack) within its duplicate window.
	h["Nats-Msg-Id"] = []string{s.stream + "/" + s.durable + "/" + strconv.FormatUint(seq, 10)}
	out := &nats.Msg{Subject: dlq.NATSSubject(s.opt.parkPrefix, tenant), Header: h, Data: msg.Data()}
	for {
		_, err := s.js.PublishMsg(ctx, out)
		if err == nil {
			break
		}
		s.log.Warn("ringfence nats: spill to park stream failed, retrying", "subject", out.Subject, "err", err)
		if !sleepCtx(ctx, s.opt.spillBackoff) {
			return false
		}
	}
	if err := msg.Ack(); err != nil {
		// The message is safe in the park stream; a lost ack only means a
		// duplicate spill after redelivery.
		s.log.Warn("ringfence nats: ack after spill", "err", err)
	}
	return true
}

// recoverSpills finds tenants with messages left in the park stream by an
// earlier run; they stay in spill mode until those are re-fed.
func (s *Source) recoverSpills(ctx context.Context) error {
	info, err := s.park.Info(ctx, jetstream.WithSubjectFilter(s.opt.parkPrefix+".>"))
	if err != nil {
		return fmt.Errorf("nats: park stream info: %w", err)
	}
	for subj, n := range info.State.Subjects {
		if n == 0 {
			continue
		}
		first, err := s.park.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("nats: park stream %s: %w", subj, err)
		}
		// The token is exact unless hashed; then the header has the key
		// (NATS trims header values, which only hashed keys depend on).
		tok, _ := dlq.SplitNATSSubject(s.opt.parkPrefix, subj)
		tenant, exact, err := dlq.ParseTenantToken(tok)
		if !exact || err != nil {
			tenant = first.Header.Get(hdrParkTenant)
		}
		s.mu.Lock()
		st := s.tenantLocked(tenant)
		st.spilling = true
		st.spilled = n
		st.cursor = first.Sequence
		s.mu.Unlock()
	}
	return nil
}

// Settle acks a message handled by the engine (or whose dead letter was
// stored). A re-fed message is deleted from the park stream instead.
func (s *Source) Settle(ctx context.Context, m *consumer.Message) error {
	switch h := m.Handle.(type) {
	case jetstream.Msg:
		seq := uint64(m.Offset)
		s.mu.Lock()
		if hm, ok := s.held[seq]; ok {
			delete(s.held, seq)
			st := s.tenants[hm.tenant]
			if st.heldMain+st.heldPark >= s.opt.tenantLimit {
				st.overSince = time.Now() // progress
			}
			st.heldMain--
			if st.spilling && st.heldMain == 0 {
				defer s.nudge()
			}
			// Idle tenants stay until a sweep (see tenantLocked): dropping
			// and re-making one per message would cost an allocation each.
		}
		s.mu.Unlock()
		if s.opt.doubleAck {
			return h.DoubleAck(ctx)
		}
		return h.Ack()
	case *parkedMsg:
		// The re-feeder purges it from the park stream (at-least-once: a
		// crash before that re-feeds it once more).
		s.mu.Lock()
		if st := s.tenants[h.tenant]; st != nil {
			if i := slices.Index(st.inflightPark, h.seq); i >= 0 {
				st.inflightPark = slices.Delete(st.inflightPark, i, i+1)
				st.heldPark--
			}
		}
		s.mu.Unlock()
		s.nudge()
		return nil
	default:
		return fmt.Errorf("nats: Settle: message handle %T is not from this source", m.Handle)
	}
}

// Commit does nothing: JetStream acks each message in Settle.
func (s *Source) Commit(context.Context, consumer.Partition, int64) error { return nil }

// Pause stops handing messages of p to the engine. For the consumer's own
// partition this blocks the consume callback (messages it already buffered
// wait); for a tenant's re-feed partition it stops re-feeding that tenant.
func (s *Source) Pause(p consumer.Partition) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p == s.part {
		if !s.paused {
			s.paused = true
			s.resumed = make(chan struct{})
		}
		return
	}
	if st := s.parkPart[p]; st != nil {
		st.parkPaused = true
	}
}

// Resume undoes Pause.
func (s *Source) Resume(p consumer.Partition) {
	s.mu.Lock()
	if p == s.part {
		if s.paused {
			s.paused = false
			close(s.resumed)
		}
	} else if st := s.parkPart[p]; st != nil {
		st.parkPaused = false
	}
	s.mu.Unlock()
	s.nudge()
}

func (s *Source) nudge() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// extendLoop keeps the messages the engine holds (in its lanes or parked)
// from reaching AckWait: every extendEvery it sends InProgress for each.
func (s *Source) extendLoop(ctx context.Context) {
	t := time.NewTicker(s.opt.extendEvery)
	defer t.Stop()
	var batch []jetstream.Msg
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		batch = batch[:0]
		s.mu.Lock()
		for _, hm := range s.held {
			batch = append(batch, hm.msg)
		}
		s.mu.Unlock()
		for _, m := range batch {
			_ = m.InProgress() // best effort; a miss means a redelivery, never a loss
		}
		clear(batch)
		s.extends.Add(1)
	}
}

// ackSeqTime reads the stream sequence and timestamp from a JetStream ack
// subject without allocating (jetstream.Msg.Metadata costs about a
// microsecond). Layouts, as in nats.go's parser:
//
//	v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>
//	v2: $JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>[.<token>]
func ackSeqTime(reply string) (seq uint64, ts int64, ok bool) {
	if !strings.HasPrefix(reply, "$JS.ACK.") {
		return 0, 0, false
	}
	var seqTok, tmTok int
	switch n := strings.Count(reply, ".") + 1; {
	case n == 9:
		seqTok, tmTok = 5, 7
	case n >= 11:
		seqTok, tmTok = 7, 9
	default:
		return 0, 0, false
	}
	var seqStr, tmStr string
	for i, rest := 0, reply; i <= tmTok; i++ {
		var tok string
		tok, rest, _ = strings.Cut(rest, ".")
		switch i {
		case seqTok:
			seqStr = tok
		case tmTok:
			tmStr = tok
		}
	}
	seq, err1 := strconv.ParseUint(seqStr, 10, 64)
	tm, err2 := strconv.ParseUint(tmStr, 10, 64)
	return seq, int64(tm), err1 == nil && err2 == nil && seq > 0
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

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// revokeAll takes every partition away from the engine and gives the
// consumer's own back, as a consumer-group rebalance would: the engine drops
// what it buffered and parked, and the Source naks the consumer messages
// the engine held (the server redelivers them, in order) and rewinds each
// re-feed to its oldest unsettled message. The conformance suite's
// Revocation case drives it.
func (s *Source) revokeAll() {
	s.mu.Lock()
	d := s.disp
	if d == nil || s.gated != nil {
		s.mu.Unlock()
		return
	}
	s.gated = make(chan struct{})
	held := make([]heldMsg, 0, len(s.held))
	seqs := make([]uint64, 0, len(s.held))
	for seq := range s.held {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	for _, seq := range seqs {
		held = append(held, s.held[seq])
	}
	clear(s.held)
	parts := []consumer.Partition{s.part}
	for _, st := range s.tenants {
		st.heldMain = 0
		if len(st.inflightPark) > 0 {
			st.cursor = st.inflightPark[0]
			st.refed -= uint64(len(st.inflightPark))
			st.inflightPark = nil
		}
		st.heldPark = 0
		if st.assigned {
			parts = append(parts, st.part)
			st.assigned = false
			delete(s.parkPart, st.part)
		}
	}
	s.mu.Unlock()

	for _, p := range parts {
		d.Revoked(p)
	}
	for _, hm := range held {
		_ = hm.msg.Nak() // redelivered at once; a lost nak waits for AckWait
	}
	d.Assigned(s.part)

	s.mu.Lock()
	close(s.gated)
	s.gated = nil
	s.mu.Unlock()
	s.nudge()
}

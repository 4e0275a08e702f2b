package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ringfence/ringfence/consumer"
)

// A GroupSource consumes one topic as a member of a Kafka consumer group
// with cooperative rebalancing: a consumer.Source built on franz-go's kgo
// client and its cooperative-sticky balancer (KIP-429). It is safe for
// concurrent use; Run may be called once.
//
// A rebalance costs only what moves. A partition that stays with its
// member is never revoked, so its fetching, its buffered and parked
// messages and its commit tracking go on through the rebalance; only the
// partitions given to another member are revoked (the engine drops what it
// held of them, the final watermark is committed before the rebalance goes
// on) and only new partitions are assigned. With
// WithClientOptions(kgo.ServerSideBalancer()) the broker assigns instead
// (KIP-848, Kafka 4.0 and later; the classic cooperative protocol on older
// brokers), just as incrementally. Every member of a group must
// use the same protocol: a Source (kafka-go, eager) and a GroupSource in
// one group do not agree on a balancer, and the later member's join fails.
//
// kgo runs the group; each assigned partition has a fetcher of its own
// (group_fetch.go), which sends its own Fetch requests to the partition's
// leader over a kgo client of its own (the options given with
// WithClientOptions apply: dialer, TLS, SASL), resuming from the group's
// committed offset, or from WithStartOffset if it has none. kgo itself
// never fetches the topic. A fetcher sends its next request as soon as it
// has handed the engine what the last one returned, while the engine's
// workers handle that, and has its own connection, so that a partition
// read to its end (its Fetch held by the broker for WithMaxWait) holds up
// no other.
//
// A revocation stops the fetchers of the partitions that move and then
// takes a lock of the source's that each delivery holds: it runs only
// between deliveries, and no record of a revoked partition is delivered
// after it. Each revoked partition's watermark is committed synchronously
// in the callback, once a commit in flight (which may include it) has
// ended; commits never overlap, and no later one includes the partition,
// so no commit of a partition lands after its revocation returned. No lock
// is held across a network call. A lost partition (the member was
// evicted) is dropped without a commit.
//
// Records are handed to the engine with DeliverBatch, per partition in
// offset order, in slices of at most 64 messages. A message of an
// uncompressed batch shares its key, value and header values with the
// fetch response kgo decoded it from (a response is never reused), as
// long as the messages the engine has not yet committed past share at
// most three fetch responses: a message held for long (a parked tenant's,
// a hanging call) so keeps at most three fetches alive, whatever flows
// meanwhile. Past that bound, and for compressed batches (decompressed
// into buffers the source lends kgo and takes back), records are copied
// out as Source does, and a message kept for long pins only its slice's
// small neighbours. Later fetches are decoded into the slabs of the
// records built from (kgo.PoolRecords). Once the engine pauses a
// partition, the rest of the fetch's records of that partition are kept
// back, and its fetcher fetches no more until Resume: it then delivers
// what it kept back first. The engine's per-partition bounds hold within
// one slice.
//
// Offsets are committed only as the engine reports them (kgo's autocommit
// is off): every CommitInterval, on revocation and on shutdown. After Run
// has returned, Commit commits at once, as Source does.
//
// Options shared with Source apply as their documentation says, except
// WithDialer (refused: pass kgo.Dialer, kgo.DialTLSConfig or kgo.SASL with
// WithClientOptions) and WithJoinBackoff (kgo backs off on its own).
type GroupSource struct {
	brokers []string
	topic   string
	group   string
	cfg     sourceConfig
	log     *slog.Logger
	watch   topicWatch
	fatal   fatal

	started atomic.Bool
	cl      atomic.Pointer[kgo.Client]
	// parts holds the assigned partitions by ID; replaced (never mutated)
	// by the rebalance callbacks, which kgo runs one at a time, under
	// commitMu.
	parts atomic.Pointer[map[int32]*groupPart]
	// commitMu guards flight and groupPart.done, and is held by the
	// rebalance callbacks while they change the table; it is never held
	// across a network call.
	commitMu sync.Mutex
	// flight is closed when the commit in flight ends; nil if none is.
	// Commits never overlap (takeFlight): a revocation's commit starts
	// only once a commit that included its partitions ended, and none
	// includes them after, as they left the table, so that no commit of a
	// partition lands after its revocation.
	flight chan struct{}
	// deliverMu is held while records are delivered and while the
	// rebalance callbacks revoke, so that no record of a partition is
	// delivered after its Revoked. It guards groupPart.rest.
	deliverMu sync.Mutex
	// shared bounds the fetches whose responses delivered messages keep
	// alive; guarded by deliverMu.
	shared sharing
	// keptRecords counts the records kept back (tests read it); guarded by
	// deliverMu.
	keptRecords int64
	// fetching counts the partitions' fetchers (group_fetch.go); once
	// noFetch is set (under commitMu, when Run's context ended) no new one
	// starts.
	fetching sync.WaitGroup
	noFetch  bool
	// fetchSeq numbers the fetch responses, for the sharing bound.
	fetchSeq atomic.Int64
	// runCtx is Run's context, the parent of every fetcher's.
	runCtx context.Context
	// pools lends kgo the slabs the fetchers' responses are decoded into
	// (see kgoPools); decomp decompresses into its buffers.
	pools  *kgoPools
	decomp kgo.Decompressor
	// stopping is set once Run's context ended: the revocation of every
	// partition that leaving the group brings commits but does not revoke
	// (the engine drains and commits after Run returns).
	stopping atomic.Bool
	// ended is set just before the group is left; later Commit calls
	// commit directly (lateCommit) once left is closed.
	ended atomic.Bool
	left  chan struct{}
}

// groupPart is one assigned partition.
type groupPart struct {
	id consumer.Partition
	// want is the highest commit point the engine reported, -1 for none.
	want atomic.Int64
	// done is the last offset committed; guarded by GroupSource.commitMu,
	// written only by the commit in flight.
	done int64
	// paused is set by Pause and read by the fetcher.
	paused atomic.Bool
	// wake is signalled by Resume, for the fetcher waiting to deliver
	// what it kept back.
	wake chan struct{}
	// stop ends the partition's fetcher.
	stop context.CancelFunc
	// fetches counts the Fetch requests sent, and waiting says the fetcher
	// waits for Resume to deliver what it kept back (tests read both).
	fetches atomic.Int64
	waiting atomic.Bool
	// rest is what fetches returned of the partition after the engine
	// paused it, to deliver first once it is resumed; restRuns says which
	// fetch each run of it came from, in order, and restBytes what it holds
	// in recordBytes. Guarded by GroupSource.deliverMu.
	rest      []*kgo.Record
	restRuns  []fetchRun
	restBytes int64
}

// fetchRun is a run of n kept-back records of one fetch, seq: each run is
// handed over sharing its own fetch's response (see sharing).
type fetchRun struct {
	seq int64
	n   int
}

// NewGroupSource returns a GroupSource for topic in consumer group group,
// reaching the cluster through brokers (host:port). It takes the options
// of NewSource (see GroupSource for the two that differ) and
// WithClientOptions. It validates its arguments and options; nothing
// connects until Run.
func NewGroupSource(brokers []string, topic, group string, opts ...SourceOption) (*GroupSource, error) {
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
	if cfg.dialerSet {
		return nil, invalid("WithDialer is kafka-go's; give a GroupSource kgo's dialer, TLS or SASL options with WithClientOptions")
	}
	s := &GroupSource{
		brokers: append([]string(nil), brokers...),
		topic:   topic,
		group:   group,
		cfg:     cfg,
		log:     cfg.logger.With("topic", topic, "group", group),
		watch:   topicWatch{grace: cfg.topicGrace},
		left:    make(chan struct{}),
		pools:   &kgoPools{},
	}
	s.decomp = kgo.DefaultDecompressor(s.pools)
	empty := map[int32]*groupPart{}
	s.parts.Store(&empty)
	return s, nil
}

// Topic returns the source topic.
func (s *GroupSource) Topic() string { return s.topic }

// Group returns the consumer group.
func (s *GroupSource) Group() string { return s.group }

// clientOpts are the kgo options every client of s starts from: brokers,
// logging and the user's WithClientOptions.
func (s *GroupSource) clientOpts() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(s.brokers...),
		kgo.WithLogger(kgoLogger{s.log}),
	}
	return append(opts, s.cfg.clientOpts...)
}

// Run joins the group and consumes until ctx is cancelled, and returns nil
// then. It returns an error when the source can never work (see the
// package documentation, "Errors"): bad credentials or ACLs, an invalid
// group or session timeout, or a topic that stayed unknown for
// UnknownTopicTimeout. Anything else is retried by kgo. On return it has
// committed what was settled and left the group.
func (s *GroupSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	if !s.started.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer close(s.left)
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.fatal.cancel = cancel
	s.runCtx = ctx

	reset := kgo.NewOffset().AtStart()
	if s.cfg.startOffset == kafkago.LastOffset {
		reset = kgo.NewOffset().AtEnd()
	}
	opts := append(s.clientOpts(),
		kgo.ConsumerGroup(s.group),
		kgo.ConsumeTopics(s.topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(reset),
		kgo.HeartbeatInterval(s.cfg.heartbeatInterval),
		kgo.SessionTimeout(s.cfg.sessionTimeout),
		kgo.RebalanceTimeout(s.cfg.rebalanceTimeout),
		// The callbacks may run before NewClient has returned: each
		// stores the client it is given if Run has not yet.
		kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, m map[string][]int32) {
			s.cl.CompareAndSwap(nil, cl)
			s.assigned(cl, m[s.topic], d)
		}),
		kgo.OnPartitionsRevoked(func(cctx context.Context, cl *kgo.Client, m map[string][]int32) {
			s.cl.CompareAndSwap(nil, cl)
			s.revoked(cctx, m[s.topic], d, true)
		}),
		kgo.OnPartitionsLost(func(cctx context.Context, cl *kgo.Client, m map[string][]int32) {
			s.cl.CompareAndSwap(nil, cl)
			s.revoked(cctx, m[s.topic], d, false)
		}),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return invalid("kgo client: %v", err)
	}
	// kgo never fetches the topic: each partition's fetcher does (assigned
	// pauses it too, in case an assignment came first).
	cl.PauseFetchTopics(s.topic)
	s.cl.Store(cl)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.commitLoop(ctx) }()
	go func() { defer wg.Done(); s.watchTopic(ctx, cl) }()
	<-ctx.Done()
	wg.Wait()
	s.commitMu.Lock()
	s.noFetch = true
	s.commitMu.Unlock()
	s.fetching.Wait()

	// Shutdown: commit what was settled, then leave. Leaving revokes every
	// partition; the callback commits what was settled since (stopping),
	// and Commit takes over once ended is set.
	s.stopping.Store(true)
	fctx, fcancel := context.WithTimeout(context.Background(), s.cfg.rebalanceTimeout)
	s.commit(fctx, nil)
	fcancel()
	s.ended.Store(true)
	cl.Close()
	if parent.Err() != nil {
		return nil
	}
	return s.fatal.get()
}

// deliver hands what ps kept back and then recs, of fetch seq, to the engine
// in slices, and keeps back the rest once the engine paused ps. What was
// kept back and is not handed over stays where it is, ahead of recs: a
// record waits through as many pauses as the engine makes, and is kept
// back only once. Called with deliverMu held.
func (s *GroupSource) deliver(ps *groupPart, recs []*kgo.Record, seq int64, sb *recordSlicer, d consumer.Dispatcher) {
	if len(ps.rest) > 0 {
		if len(recs) > 0 && ps.paused.Load() {
			s.keepBack(ps, recs, seq) // still paused after a fetch that returned more
			return
		}
		for len(ps.rest) > 0 {
			run := ps.restRuns[0]
			n, size := s.send(ps, ps.rest[:run.n], run.seq, true, sb, d)
			s.dropRest(ps, n, size)
			if n < run.n {
				break // paused again
			}
		}
		if len(ps.rest) > 0 {
			s.keepBack(ps, recs, seq)
			return
		}
	}
	n, _ := s.send(ps, recs, seq, false, sb, d)
	s.keepBack(ps, recs[n:], seq)
}

// send hands recs, of fetch seq, to the engine in slices until the engine
// pauses ps, and returns how many it handed over and, if sized, what they
// held in recordBytes. Called with deliverMu held.
func (s *GroupSource) send(ps *groupPart, recs []*kgo.Record, seq int64, sized bool, sb *recordSlicer, d consumer.Dispatcher) (n int, size int64) {
	for n < len(recs) {
		if ps.paused.Load() {
			return n, size
		}
		slice := recs[n:min(n+deliverSlice, len(recs))]
		ms, shared := sb.build(ps.id, slice, s.shared.admit(seq))
		if shared {
			s.shared.note(seq, ps, slice[len(slice)-1].Offset+1)
		}
		for _, r := range slice {
			if sized {
				size += recordBytes(r)
			}
			r.Recycle() // nothing of the record itself is kept: kgo may reuse it (kgoPools)
		}
		n += len(slice)
		d.DeliverBatch(ms)
	}
	return n, size
}

// recordOverhead is what a kept-back record holds beyond its bytes: its
// kgo struct.
const recordOverhead = int64(unsafe.Sizeof(kgo.Record{}))

// recordBytes is what keeping r back holds (groupPart.restBytes).
func recordBytes(r *kgo.Record) int64 {
	n := int64(len(r.Key)+len(r.Value)) + recordOverhead
	for _, h := range r.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return n
}

// keepBack appends recs, of fetch seq, to what ps keeps back until Resume.
// Called with deliverMu held.
func (s *GroupSource) keepBack(ps *groupPart, recs []*kgo.Record, seq int64) {
	if len(recs) == 0 {
		return
	}
	if k := len(ps.restRuns) - 1; k >= 0 && ps.restRuns[k].seq == seq {
		ps.restRuns[k].n += len(recs)
	} else {
		ps.restRuns = append(ps.restRuns, fetchRun{seq: seq, n: len(recs)})
	}
	ps.rest = append(ps.rest, recs...)
	s.keptRecords += int64(len(recs))
	var n int64
	for _, r := range recs {
		n += recordBytes(r)
	}
	ps.restBytes += n
}

// dropRest drops the first n records ps keeps back (handed over, or of a
// revoked partition), which held size in recordBytes. Called with
// deliverMu held.
func (s *GroupSource) dropRest(ps *groupPart, n int, size int64) {
	clear(ps.rest[:n])
	ps.rest = ps.rest[n:]
	ps.restBytes -= size
	if len(ps.rest) == 0 {
		ps.rest, ps.restRuns, ps.restBytes = nil, nil, 0
		return
	}
	for n > 0 {
		if run := &ps.restRuns[0]; run.n > n {
			run.n -= n
			break
		}
		n -= ps.restRuns[0].n
		ps.restRuns = ps.restRuns[1:]
	}
}

// assigned records newly assigned partitions, announces them and starts
// their fetchers. cl is the group's client.
func (s *GroupSource) assigned(cl *kgo.Client, ids []int32, d consumer.Dispatcher) {
	if len(ids) == 0 {
		return
	}
	cl.PauseFetchTopics(s.topic) // pausedMu only: safe in the callback
	s.commitMu.Lock()
	parts := maps(*s.parts.Load())
	var fresh []*groupPart
	for _, id := range ids {
		ps := &groupPart{id: consumer.Partition{Topic: s.topic, ID: id}, done: -1, wake: make(chan struct{}, 1)}
		ps.want.Store(-1)
		parts[id] = ps
		fresh = append(fresh, ps)
	}
	s.parts.Store(&parts)
	start := !s.noFetch
	if start {
		s.fetching.Add(len(fresh))
	}
	s.commitMu.Unlock()
	s.log.Debug("kafka: partitions assigned", "partitions", ids)
	for _, ps := range fresh {
		d.Assigned(ps.id)
	}
	if !start {
		return
	}
	for _, ps := range fresh {
		var fctx context.Context
		fctx, ps.stop = context.WithCancel(s.runCtx)
		go s.fetchPart(fctx, cl, ps, d)
	}
}

// revoked takes partitions away: the engine drops them (no delivery runs
// meanwhile), they leave the table, and (when commit is set) their final
// watermarks are committed, all before the rebalance goes on. On shutdown
// it only commits.
func (s *GroupSource) revoked(ctx context.Context, ids []int32, d consumer.Dispatcher, commit bool) {
	if len(ids) == 0 {
		return
	}
	cur := *s.parts.Load()
	var gone []*groupPart
	for _, id := range ids {
		if ps := cur[id]; ps != nil {
			gone = append(gone, ps)
		}
	}
	if s.stopping.Load() {
		if commit {
			s.commit(ctx, gone)
		}
		return
	}
	for _, ps := range gone {
		if ps.stop != nil {
			ps.stop() // its fetcher delivers nothing once it left the table
		}
	}
	s.deliverMu.Lock()
	for _, ps := range gone {
		d.Revoked(ps.id)
		s.dropRest(ps, len(ps.rest), ps.restBytes) // never delivered: the partition is gone
	}
	s.commitMu.Lock()
	parts := maps(*s.parts.Load())
	for _, id := range ids {
		delete(parts, id)
	}
	s.parts.Store(&parts)
	s.commitMu.Unlock()
	s.deliverMu.Unlock()
	if commit {
		// A periodic commit that included them has ended once this one
		// is in flight; none starts after, as they left the table.
		cctx, cancel := context.WithTimeout(ctx, s.cfg.rebalanceTimeout)
		s.commit(cctx, gone)
		cancel()
	}
	s.log.Debug("kafka: partitions revoked", "partitions", ids, "committed", commit)
}

func maps(m map[int32]*groupPart) map[int32]*groupPart {
	out := make(map[int32]*groupPart, len(m)+4)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// commitLoop commits every CommitInterval until ctx ends.
func (s *GroupSource) commitLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.commitInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.commit(ctx, nil)
		case <-ctx.Done():
			return
		}
	}
}

// commit commits the watermarks that moved of the partitions in list (all
// assigned partitions when nil), synchronously. Commits never overlap: one
// waits for the commit in flight (which may include partitions that left
// the table meanwhile) before it reads what to commit, and none is made
// under commitMu.
func (s *GroupSource) commit(ctx context.Context, list []*groupPart) {
	cl := s.cl.Load()
	s.commitMu.Lock()
	s.takeFlight()
	if list == nil {
		for _, ps := range *s.parts.Load() {
			list = append(list, ps)
		}
	}
	offsets := map[int32]kgo.EpochOffset{}
	byID := make(map[int32]*groupPart, len(list))
	for _, ps := range list {
		if w := ps.want.Load(); w > ps.done {
			offsets[ps.id.ID] = kgo.EpochOffset{Epoch: -1, Offset: w}
			byID[ps.id.ID] = ps
		}
	}
	if len(offsets) == 0 {
		s.landFlight()
		s.commitMu.Unlock()
		return
	}
	s.commitMu.Unlock()
	var acked []*groupPart
	cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{s.topic: offsets},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				// Uncommitted messages are redelivered if the partition
				// moves; the next tick retries.
				if ctx.Err() == nil && !s.failed(err) {
					s.log.Warn("kafka: commit failed", "err", err)
				}
				return
			}
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
						if !s.failed(err) {
							s.log.Warn("kafka: commit failed", "partition", p.Partition, "err", err)
						}
						continue
					}
					if ps := byID[p.Partition]; ps != nil && t.Topic == s.topic {
						acked = append(acked, ps)
					}
				}
			}
		})
	s.commitMu.Lock()
	for _, ps := range acked {
		ps.done = offsets[ps.id.ID].Offset
	}
	s.landFlight()
	s.commitMu.Unlock()
}

// takeFlight waits until no commit is in flight and marks one in flight,
// for the caller to make with commitMu released and end with landFlight.
// Called with commitMu held; it is released while it waits.
func (s *GroupSource) takeFlight() {
	for s.flight != nil {
		f := s.flight
		s.commitMu.Unlock()
		<-f
		s.commitMu.Lock()
	}
	s.flight = make(chan struct{})
}

// landFlight ends the commit in flight. Called with commitMu held.
func (s *GroupSource) landFlight() {
	close(s.flight)
	s.flight = nil
}

// Settle does nothing: Kafka progress is committed by watermark (Commit).
func (s *GroupSource) Settle(context.Context, *consumer.Message) error { return nil }

// SettleIsNoop reports that Settle does nothing (see consumer.SettleNooper).
func (s *GroupSource) SettleIsNoop() bool { return true }

// MessagingSystem implements consumer.SystemNamer: "kafka" in traces.
func (s *GroupSource) MessagingSystem() string { return "kafka" }

var _ consumer.SettleNooper = (*GroupSource)(nil)
var _ consumer.SystemNamer = (*GroupSource)(nil)

// Commit records that every message of p below next is settled; it is
// committed within CommitInterval, or when p is revoked. After Run has
// returned, Commit commits at once (accepted while the group has no
// member).
func (s *GroupSource) Commit(ctx context.Context, p consumer.Partition, next int64) error {
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

// lateCommit commits ps's watermark outside the group, once it was left,
// over a client of its own.
func (s *GroupSource) lateCommit(ctx context.Context, ps *groupPart) error {
	select {
	case <-s.left:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.commitMu.Lock()
	s.takeFlight()
	w := ps.want.Load()
	if w <= ps.done {
		s.landFlight()
		s.commitMu.Unlock()
		return nil
	}
	s.commitMu.Unlock()
	err := s.commitOutside(ctx, ps.id.ID, w)
	s.commitMu.Lock()
	if err == nil {
		ps.done = w
	}
	s.landFlight()
	s.commitMu.Unlock()
	return err
}

// commitOutside commits offset next of partition id for the group, outside
// the group (after it was left), over a client of its own.
func (s *GroupSource) commitOutside(ctx context.Context, id int32, next int64) error {
	cl, err := kgo.NewClient(s.clientOpts()...)
	if err != nil {
		return fmt.Errorf("kafka: commit %s/%d after shutdown: %w", s.topic, id, err)
	}
	defer cl.Close()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = s.group
	req.Generation = -1
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = s.topic
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset, rp.LeaderEpoch = id, next, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if e := kerr.ErrorForCode(p.ErrorCode); e != nil && err == nil {
					err = e
				}
			}
		}
	}
	if err != nil {
		return fmt.Errorf("kafka: commit %s/%d after shutdown: %w", s.topic, id, err)
	}
	return nil
}

func (s *GroupSource) lookup(p consumer.Partition) *groupPart {
	if p.Topic != s.topic {
		return nil
	}
	return (*s.parts.Load())[p.ID]
}

// Pause stops delivering p: the rest of the records of p being delivered
// are kept back until Resume, and p's fetcher fetches no more meanwhile
// (see GroupSource).
func (s *GroupSource) Pause(p consumer.Partition) {
	if ps := s.lookup(p); ps != nil {
		ps.paused.Store(true)
	}
}

// Resume undoes Pause. What p kept back is delivered first, by p's
// fetcher, which Resume wakes.
func (s *GroupSource) Resume(p consumer.Partition) {
	if ps := s.lookup(p); ps != nil {
		ps.paused.Store(false)
		select {
		case ps.wake <- struct{}{}:
		default:
		}
	}
}

// kgoTerminal are kgo's broker answers that no retry can change (see
// terminalCodes).
var kgoTerminal = []error{
	kerr.SaslAuthenticationFailed,
	kerr.UnsupportedSaslMechanism,
	kerr.IllegalSaslState,
	kerr.TopicAuthorizationFailed,
	kerr.GroupAuthorizationFailed,
	kerr.ClusterAuthorizationFailed,
	kerr.InvalidGroupID,
	kerr.InvalidSessionTimeout,
	kerr.InvalidTopicException,
}

// failed reports err to Run if it is terminal, or if it says the topic is
// unknown and has been for the whole grace; true then.
func (s *GroupSource) failed(err error) bool {
	for _, t := range kgoTerminal {
		if errors.Is(err, t) {
			s.fatal.set(fmt.Errorf("kafka: topic %q, group %q: %w", s.topic, s.group, err))
			return true
		}
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		if d, over := s.watch.unknown(time.Now()); over {
			s.fatal.set(fmt.Errorf("%w: topic %q unknown to the cluster for %v (UnknownTopicTimeout %v): %w",
				ErrUnknownTopic, s.topic, d.Round(time.Millisecond), s.watch.grace, err))
			return true
		}
	}
	return false
}

// watchTopic asks the cluster for the topic every probeEvery, so that a
// topic never created or deleted ends Run after UnknownTopicTimeout (kgo
// itself waits for a missing topic for ever).
func (s *GroupSource) watchTopic(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(s.watch.probeEvery())
	defer t.Stop()
	for {
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(s.topic)
		req.Topics = append(req.Topics, rt)
		pctx, cancel := context.WithTimeout(ctx, max(s.watch.probeEvery(), 2*time.Second))
		resp, err := req.RequestWith(pctx, cl)
		cancel()
		if err == nil && len(resp.Topics) == 1 {
			err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
		}
		switch {
		case err == nil:
			s.watch.seen()
		case ctx.Err() != nil, s.failed(err):
			return
		case errors.Is(err, kerr.UnknownTopicOrPartition):
			s.log.Warn("kafka: topic does not exist; waiting for it", "timeout", s.watch.grace)
		default:
			s.log.Debug("kafka: topic metadata failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// kgoLogger routes kgo's logging to slog, one level down (kgo's Info is
// chatty about routine group events).
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel {
	switch {
	case k.l.Enabled(context.Background(), slog.LevelDebug):
		return kgo.LogLevelWarn
	case k.l.Enabled(context.Background(), slog.LevelInfo):
		return kgo.LogLevelError
	}
	return kgo.LogLevelNone
}

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelDebug
	if level == kgo.LogLevelError {
		lv = slog.LevelInfo
	}
	k.l.Log(context.Background(), lv, "kgo: "+msg, keyvals...)
}

package kafka

// Fetching a GroupSource's partitions. kgo runs the group (membership,
// the cooperative-sticky assignment, heartbeats, commits) and never fetches
// the topic: it is paused in kgo from the start. Each assigned partition has
// a fetcher of its own, a goroutine that sends its own Fetch requests to the
// partition's leader over a kgo client of its own (one connection; the
// source's kgo options apply: dialer, TLS, SASL), has kgo decode each
// response (kgo.ProcessFetchPartition, into the source's pooled slabs) and
// delivers the records under deliverMu. kgo's own fetching keeps one Fetch in
// flight per broker and asks for more only once a poll took what the last
// one returned; here each partition asks again as soon as it has handed
// the engine what it got, while the engine's workers handle that
// (BenchmarkConsume guards the difference).
//
// A fetcher stops when its partition is revoked (revoked cancels it before
// it takes deliverMu, and a fetcher delivers only while its partition is
// still in the table) or when Run ends. While the engine has its partition
// paused with records kept back, it does not fetch: it waits for Resume,
// delivers what was kept back, then fetches again.

import (
	"context"
	"errors"
	"fmt"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ringfence/ringfence/consumer"
)

// errNoLeader is a fetcher's error while its partition has no leader in the
// cluster's metadata.
var errNoLeader = errors.New("kafka: partition has no leader")

// partFetch is where a fetcher of one partition is: the next offset, and
// the leader it fetches from (-1: look it up).
type partFetch struct {
	offset  int64 // next offset to fetch; -1: not known yet
	leader  int32
	epoch   int32 // the leader's epoch, -1 if unknown
	topicID [16]byte
	cl      *kgo.Client        // the fetches' own client
	iso     kgo.IsolationLevel // of the source's kgo options
}

// fetchPart fetches ps and delivers what it returns, in offset order, until
// ctx ends (Run ended, or ps was revoked), retrying failures with backoff
// (100ms doubling up to 5s).
func (s *GroupSource) fetchPart(ctx context.Context, cl *kgo.Client, ps *groupPart, d consumer.Dispatcher) {
	defer s.fetching.Done()
	// A connection of its own: a Fetch the broker holds for MaxWait (its
	// partition read to the end) would hold up every request behind it on
	// a shared one.
	fcl, err := kgo.NewClient(s.clientOpts()...)
	if err != nil {
		s.fatal.set(invalid("kgo client: %v", err))
		return
	}
	defer fcl.Close()
	f := partFetch{offset: -1, leader: -1, epoch: -1, cl: fcl}
	if iso, ok := fcl.OptValue(kgo.FetchIsolationLevel).(kgo.IsolationLevel); ok {
		f.iso = iso
	}
	var sb recordSlicer
	for attempt := 0; ; {
		if !s.deliverKept(ctx, ps, &sb, d) {
			return
		}
		if attempt > 0 && !sleep(ctx, backoff(attempt)) {
			return
		}
		recs, seq, err := s.fetchOnce(ctx, cl, ps, &f)
		switch {
		case err == nil:
			attempt = 0
			if len(recs) > 0 && !s.deliverFetched(ps, recs, seq, &sb, d) {
				return
			}
			continue
		case ctx.Err() != nil:
			return
		case s.failed(err):
			return
		}
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			s.log.Warn("kafka: topic unknown; waiting for it", "partition", ps.id.ID, "err", err)
		} else {
			s.log.Warn("kafka: fetch failed; retrying", "partition", ps.id.ID, "offset", f.offset, "attempt", attempt+1, "err", err)
		}
		attempt++
	}
}

// current reports whether ps is still assigned. Called with deliverMu held.
func (s *GroupSource) current(ps *groupPart) bool {
	return (*s.parts.Load())[ps.id.ID] == ps
}

// deliverKept delivers what ps kept back once the engine resumes it,
// waiting for Resume as often as the engine pauses it again; false if ctx
// ended or ps was revoked.
func (s *GroupSource) deliverKept(ctx context.Context, ps *groupPart, sb *recordSlicer, d consumer.Dispatcher) bool {
	for {
		s.deliverMu.Lock()
		if !s.current(ps) {
			s.deliverMu.Unlock()
			return false
		}
		if len(ps.rest) == 0 {
			s.deliverMu.Unlock()
			return ctx.Err() == nil
		}
		if !ps.paused.Load() {
			s.shared.release(*s.parts.Load())
			s.deliver(ps, nil, -1, sb, d)
			s.deliverMu.Unlock()
			continue
		}
		s.deliverMu.Unlock()
		ps.waiting.Store(true)
		select {
		case <-ps.wake:
		case <-ctx.Done():
			return false
		}
		ps.waiting.Store(false)
	}
}

// deliverFetched delivers recs, of fetch seq, to the engine (keeping back
// what it does not take while paused); false if ps was revoked meanwhile.
func (s *GroupSource) deliverFetched(ps *groupPart, recs []*kgo.Record, seq int64, sb *recordSlicer, d consumer.Dispatcher) bool {
	s.deliverMu.Lock()
	defer s.deliverMu.Unlock()
	if !s.current(ps) {
		return false
	}
	s.shared.release(*s.parts.Load())
	s.deliver(ps, recs, seq, sb, d)
	return true
}

// fetchOnce sends one Fetch for ps from f.offset and returns what kgo
// decoded of it, numbered for the sharing bound, and moves f past it. An
// error that says the leader moved makes the next try look it up again;
// OffsetOutOfRange makes it resolve the offset again.
func (s *GroupSource) fetchOnce(ctx context.Context, cl *kgo.Client, ps *groupPart, f *partFetch) ([]*kgo.Record, int64, error) {
	id := ps.id.ID
	if f.offset < 0 {
		off, err := s.startOffset(ctx, cl, id, f.iso)
		if err != nil {
			return nil, 0, err
		}
		f.offset = off
	}
	if f.leader < 0 {
		if err := s.findLeader(ctx, cl, id, f); err != nil {
			return nil, 0, err
		}
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = int32(s.cfg.maxWait.Milliseconds())
	req.MinBytes = 1
	req.MaxBytes = int32(min(s.cfg.maxBytes, 1<<30))
	if f.iso == kgo.ReadCommitted() {
		req.IsolationLevel = 1
	}
	req.SessionEpoch = -1 // no fetch session
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = s.topic, f.topicID
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.CurrentLeaderEpoch = id, f.offset, f.epoch
	rp.PartitionMaxBytes = req.MaxBytes
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)

	ps.fetches.Add(1)
	fctx, cancel := context.WithTimeout(ctx, s.cfg.maxWait+fetchSlack)
	kresp, err := f.cl.Broker(int(f.leader)).Request(fctx, req)
	cancel()
	if err != nil {
		f.leader = -1
		return nil, 0, err
	}
	resp := kresp.(*kmsg.FetchResponse)
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		f.leader = -1
		return nil, 0, err
	}
	var part *kmsg.FetchResponseTopicPartition
	for i := range resp.Topics {
		for j := range resp.Topics[i].Partitions {
			if resp.Topics[i].Partitions[j].Partition == id {
				part = &resp.Topics[i].Partitions[j]
			}
		}
	}
	if part == nil {
		f.leader = -1
		return nil, 0, fmt.Errorf("kafka: fetch of partition %d: no answer for it", id)
	}
	if err := kerr.ErrorForCode(part.ErrorCode); err != nil {
		switch {
		case errors.Is(err, kerr.OffsetOutOfRange):
			s.log.Warn("kafka: offset out of range", "partition", id, "offset", f.offset)
			off, rerr := s.resolveOffset(ctx, cl, id, f.offset, f.iso)
			if rerr == nil {
				f.offset = off
			}
		default:
			f.leader = -1 // not the leader any more, or the topic changed
		}
		return nil, 0, err
	}
	fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
		Offset:         f.offset,
		IsolationLevel: f.iso,
		Topic:          s.topic,
		Partition:      id,
		Pools:          []kgo.Pool{s.pools},
	}, part, s.decomp, nil)
	if next > f.offset {
		f.offset = next
	}
	if fp.Err != nil && len(fp.Records) == 0 {
		return nil, 0, fp.Err
	}
	return fp.Records, s.fetchSeq.Add(1), nil
}

// findLeader looks up the leader of partition id, its epoch and the
// topic's ID in the cluster's metadata.
func (s *GroupSource) findLeader(ctx context.Context, cl *kgo.Client, id int32, f *partFetch) error {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(s.topic)
	req.Topics = append(req.Topics, rt)
	mctx, cancel := context.WithTimeout(ctx, fetchSlack)
	resp, err := req.RequestWith(mctx, cl)
	cancel()
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != s.topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return err
		}
		s.watch.seen()
		for _, p := range t.Partitions {
			if p.Partition != id {
				continue
			}
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil && !errors.Is(err, kerr.ReplicaNotAvailable) {
				return err
			}
			if p.Leader < 0 {
				return errNoLeader
			}
			f.leader, f.epoch, f.topicID = p.Leader, p.LeaderEpoch, t.TopicID
			return nil
		}
		return fmt.Errorf("kafka: partition %d: %w", id, kerr.UnknownTopicOrPartition)
	}
	return fmt.Errorf("kafka: topic %s: %w", s.topic, kerr.UnknownTopicOrPartition)
}

// startOffset returns where the group resumes partition id: its committed
// offset, or the start or end of the log (WithStartOffset) if the group has
// committed none. A committed offset outside the log is resolved by the
// OffsetOutOfRange its first fetch gets, as Source does.
func (s *GroupSource) startOffset(ctx context.Context, cl *kgo.Client, id int32, iso kgo.IsolationLevel) (int64, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = s.group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = s.topic
	rt.Partitions = []int32{id}
	req.Topics = append(req.Topics, rt)
	octx, cancel := context.WithTimeout(ctx, fetchSlack)
	resp, err := req.RequestWith(octx, cl)
	cancel()
	if err != nil {
		return -1, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return -1, err
	}
	committed := int64(-1)
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if t.Topic != s.topic || p.Partition != id {
				continue
			}
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return -1, err
			}
			committed = p.Offset
		}
	}
	if committed >= 0 {
		return committed, nil
	}
	return s.resolveOffset(ctx, cl, id, committed, iso)
}

// resolveOffset turns offset (-1: none committed) into the offset to fetch:
// the log's start or end for none (WithStartOffset), the start for an
// offset below it, the end for one past it.
func (s *GroupSource) resolveOffset(ctx context.Context, cl *kgo.Client, id int32, offset int64, iso kgo.IsolationLevel) (int64, error) {
	first, err := s.listOffset(ctx, cl, id, -2, iso)
	if err != nil {
		return -1, err
	}
	last, err := s.listOffset(ctx, cl, id, -1, iso)
	if err != nil {
		return -1, err
	}
	switch {
	case offset < 0 && s.cfg.startOffset == kafkago.LastOffset:
		return last, nil
	case offset < first:
		return first, nil
	case offset > last:
		return last, nil
	}
	return offset, nil
}

// listOffset returns partition id's log start (ts -2) or end (ts -1, the
// last stable offset under read_committed).
func (s *GroupSource) listOffset(ctx context.Context, cl *kgo.Client, id int32, ts int64, iso kgo.IsolationLevel) (int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	if iso == kgo.ReadCommitted() {
		req.IsolationLevel = 1
	}
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = s.topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition, rp.Timestamp, rp.CurrentLeaderEpoch = id, ts, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	lctx, cancel := context.WithTimeout(ctx, fetchSlack)
	resp, err := req.RequestWith(lctx, cl)
	cancel()
	if err != nil {
		return -1, err
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if t.Topic != s.topic || p.Partition != id {
				continue
			}
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return -1, err
			}
			return p.Offset, nil
		}
	}
	return -1, fmt.Errorf("kafka: list offsets of partition %d: no answer for it", id)
}

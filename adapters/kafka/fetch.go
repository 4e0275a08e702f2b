package kafka

// Fetching a source partition. Each assigned partition has a fetcher of its
// own: one connection to the partition's leader (found with a Metadata
// request to a bootstrap broker, never creating the topic), over which it
// sends its own Fetch requests, encoded with franz-go's kmsg (conn.go), and
// whose record batches it decodes itself (records.go) and copies into the
// engine's messages a slice at a time (messages.go). The response buffer is
// reused from fetch to fetch. kafka-go (group membership, commits, offsets,
// metadata checks) is not on this path: its Client.Fetch decoded through a
// page buffer and allocated three times per message.
//
// A fetch asks for one partition at the highest Fetch version in [4, 11]
// that the leader supports (v12 is flexible, v13 names topics by ID), reads
// uncommitted (transaction markers are skipped, aborted records delivered,
// as before), with MinBytes 1 and the source's MaxBytes (for the request
// and the partition) and MaxWait. It may take MaxWait+fetchSlack; ctx
// cancellation aborts it at once. An I/O error, or any partition error but
// OffsetOutOfRange, closes the connection, and the next try finds the
// leader again; a partition error is a kafka-go Error, so that the
// classification of liveness.go applies as it did.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ringfence/ringfence/consumer"
)

// deliverSlice is the most messages of one fetch handed to the engine in
// one DeliverBatch. A fetch of MaxBytes may hold thousands of small
// messages; delivering it in slices, and stopping once the engine paused
// the partition (the rest waits in fetcher.rest for Resume), keeps the
// engine's per-partition bounds within deliverSlice messages.
const deliverSlice = 64

// fetchSlack is how much longer than MaxWait one fetch may take before it
// is abandoned as hung (a broker that vanished without closing the
// connection).
const fetchSlack = 10 * time.Second

// fetch reads ps and delivers each fetched batch, in offset order, until
// ctx ends, retrying failures with backoff (100ms doubling up to 5s).
func (s *Source) fetch(ctx context.Context, ps *partition, d consumer.Dispatcher) {
	f := s.newFetcher(ps)
	defer f.drop()
	offset := ps.start
	resolve := offset < 0
	for attempt := 0; ; {
		if !ps.waitResumed(ctx) {
			return
		}
		if attempt > 0 && !sleep(ctx, backoff(attempt)) {
			return
		}
		var err error
		if resolve {
			offset, err = s.resolve(ctx, int(ps.id.ID), offset)
			resolve = err != nil
		}
		if err == nil {
			offset, err = f.fetchOnce(ctx, offset, d)
		}
		switch {
		case err == nil:
			attempt = 0
			continue
		case ctx.Err() != nil:
			return
		case errors.Is(err, kafkago.OffsetOutOfRange):
			// Retention removed what we wanted, or we are past the end:
			// resolve the offset against the log's range again.
			s.log.Warn("kafka: offset out of range", "partition", ps.id.ID, "offset", offset)
			resolve = true
		case cacheMiss(err):
			// kafka-go's cached metadata does not know the topic (yet):
			// ask the cluster itself whether it exists.
			if err = s.checkTopic(ctx); err != nil && (ctx.Err() != nil || s.failed(err)) {
				return
			}
			if err != nil {
				s.log.Warn("kafka: topic unknown; waiting for it", "partition", ps.id.ID, "err", err)
			}
		case s.failed(err):
			return
		default:
			s.log.Warn("kafka: fetch failed; retrying", "partition", ps.id.ID, "offset", offset, "attempt", attempt+1, "err", err)
		}
		attempt++
	}
}

// checkTopic asks the cluster (not kafka-go's metadata cache) whether the
// source topic exists. If it does, it is marked seen and the cache is
// refreshed; if not, the error wraps UnknownTopicOrPartition.
func (s *Source) checkTopic(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, fetchSlack)
	defer cancel()
	live, err := liveTopics(cctx, s.cfg.dialer, s.brokers)
	if err != nil {
		return err
	}
	if _, ok := live[s.topic]; !ok {
		return fmt.Errorf("kafka: topic %s: %w", s.topic, kafkago.UnknownTopicOrPartition)
	}
	s.watch.seen()
	refreshCache(cctx, s.client, s.topic)
	return nil
}

// resolve turns offset (FirstOffset, LastOffset, or one outside the log)
// into the absolute offset to fetch: the log start for FirstOffset or an
// offset below it, the log end for LastOffset or an offset past it.
func (s *Source) resolve(ctx context.Context, part int, offset int64) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, fetchSlack)
	defer cancel()
	first, last, err := partitionBounds(rctx, s.client, s.topic, part)
	if err != nil {
		return offset, err
	}
	switch {
	case offset == kafkago.FirstOffset, offset >= 0 && offset < first:
		return first, nil
	case offset == kafkago.LastOffset, offset > last:
		return last, nil
	}
	return offset, nil
}

// partitionBounds returns the first and the next offset of topic/part.
func partitionBounds(ctx context.Context, cl *kafkago.Client, topic string, part int) (first, last int64, err error) {
	resp, err := cl.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{
		topic: {kafkago.FirstOffsetOf(part), kafkago.LastOffsetOf(part)},
	}})
	if err != nil {
		return 0, 0, fmt.Errorf("kafka: offsets of %s/%d: %w", topic, part, err)
	}
	for _, po := range resp.Topics[topic] {
		if po.Partition != part {
			continue
		}
		if po.Error != nil {
			return 0, 0, fmt.Errorf("kafka: offsets of %s/%d: %w", topic, part, po.Error)
		}
		return po.FirstOffset, po.LastOffset, nil
	}
	return 0, 0, fmt.Errorf("kafka: offsets of %s/%d: no answer: %w", topic, part, kafkago.UnknownTopicOrPartition)
}

// fetcher fetches one partition over its own connection to the leader.
type fetcher struct {
	s       *Source
	ps      *partition
	conn    *brokerConn // nil until connected, and after an error
	epoch   int32       // the leader epoch Metadata gave, -1 if unknown
	version int16       // of Fetch
	req     kmsg.FetchRequest
	resp    kmsg.FetchResponse
	rd      batchReader
	sb      sliceBuilder
	// rest is what the last response still held when the engine paused
	// the partition (the batches from the one being read), kept in conn's
	// response buffer until it is delivered: a resumed partition goes on
	// from it instead of fetching it again (with a queue bound smaller than
	// a response, the engine's pauses made the broker send most records
	// several times over).
	rest   []byte
	restAt int64 // the offset rest goes on from
}

func (s *Source) newFetcher(ps *partition) *fetcher {
	f := &fetcher{s: s, ps: ps, req: kmsg.NewFetchRequest()}
	maxBytes := int32(min(s.cfg.maxBytes, math.MaxInt32))
	f.req.MaxWaitMillis = int32(min(max(s.cfg.maxWait.Milliseconds(), 1), math.MaxInt32))
	f.req.MinBytes = 1
	f.req.MaxBytes = maxBytes
	f.req.IsolationLevel = 0 // read uncommitted
	t := kmsg.NewFetchRequestTopic()
	t.Topic = s.topic
	p := kmsg.NewFetchRequestTopicPartition()
	p.Partition = ps.id.ID
	p.PartitionMaxBytes = maxBytes
	t.Partitions = []kmsg.FetchRequestTopicPartition{p}
	f.req.Topics = []kmsg.FetchRequestTopic{t}
	return f
}

// drop closes the connection; the next fetch finds the leader again.
func (f *fetcher) drop() {
	if f.conn != nil {
		f.rest = nil
		f.conn.releaseBuf()
		f.conn.close()
		f.conn = nil
	}
}

// connect finds the partition's leader and connects to it.
func (f *fetcher) connect(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, fetchSlack)
	defer cancel()
	addr, epoch, c, err := f.s.leaderOf(cctx, f.ps.id.ID)
	if err != nil {
		return err
	}
	if c == nil {
		if c, err = dialBroker(cctx, f.s.cfg.dialer, addr); err != nil {
			return err
		}
	}
	v := c.version(kmsg.Fetch)
	if v < 4 {
		c.close()
		return fmt.Errorf("kafka: broker %s supports Fetch up to v%d; the source needs v4 (Kafka 0.11) or later", addr, v)
	}
	f.conn, f.epoch, f.version = c, epoch, min(v, 11)
	return nil
}

// fetchOnce fetches the partition once from offset and delivers what came
// back, in DeliverBatch calls of up to deliverSlice messages, stopping
// early when the engine pauses it. It returns the offset to fetch next.
func (f *fetcher) fetchOnce(ctx context.Context, offset int64, d consumer.Dispatcher) (int64, error) {
	if f.conn != nil && f.conn.stale() {
		f.drop()
	}
	if rest := f.rest; rest != nil {
		// Go on with the response a pause cut short. offset is always
		// where the pause left it; were it not, the rest is dropped, never
		// delivered from the wrong place.
		f.rest = nil
		next, err := offset, error(nil)
		if offset == f.restAt {
			next, err = f.deliver(rest, offset, d) // may keep a rest again
		}
		if f.rest == nil {
			f.conn.releaseBuf()
		}
		if err != nil || next != offset || f.rest != nil {
			return next, err
		}
		// Nothing past offset in it (a batch the broker cut short): fetch.
	}
	if f.conn == nil {
		if err := f.connect(ctx); err != nil {
			return offset, err
		}
	}
	f.req.Version = f.version
	rp := &f.req.Topics[0].Partitions[0]
	rp.FetchOffset = offset
	rp.CurrentLeaderEpoch = f.epoch
	conn := f.conn
	defer func() {
		if f.rest == nil {
			conn.releaseBuf() // after deliver copied the records out
		}
	}()
	if err := conn.roundTrip(ctx, &f.req, &f.resp, f.s.cfg.maxWait+fetchSlack); err != nil {
		f.drop()
		return offset, err
	}
	addr := f.conn.addr
	failed := func(format string, args ...any) error {
		return fmt.Errorf("kafka: fetch %s/%d at offset %d from %s: "+format, append([]any{f.s.topic, f.ps.id.ID, offset, addr}, args...)...)
	}
	if f.resp.ErrorCode != 0 {
		f.drop()
		return offset, failed("%w", kafkago.Error(f.resp.ErrorCode))
	}
	var part *kmsg.FetchResponseTopicPartition
	for i := range f.resp.Topics {
		t := &f.resp.Topics[i]
		for j := range t.Partitions {
			if t.Topic == f.s.topic && t.Partitions[j].Partition == f.ps.id.ID {
				part = &t.Partitions[j]
			}
		}
	}
	if part == nil {
		f.drop()
		return offset, failed("no answer for the partition")
	}
	if part.ErrorCode != 0 {
		err := kafkago.Error(part.ErrorCode)
		if err != kafkago.OffsetOutOfRange {
			f.drop() // NotLeaderForPartition, FencedLeaderEpoch, ...: find the leader again
		}
		return offset, failed("%w", err)
	}
	f.s.watch.seen()
	next, err := f.deliver(part.RecordBatches, offset, d)
	if err == nil && next == offset && len(part.RecordBatches) > 0 {
		err = failed("the first record batch came back cut short (larger than MaxBytes %d?)", f.s.cfg.maxBytes)
	}
	return next, err
}

// deliver decodes batches and delivers their records at offset or later,
// in slices of deliverSlice, until the end or until the engine pauses the
// partition; then f.rest keeps what was not delivered. It returns the
// offset after what it passed.
func (f *fetcher) deliver(batches []byte, offset int64, d consumer.Dispatcher) (int64, error) {
	rd, sb := &f.rd, &f.sb
	rd.reset(batches, offset)
	defer rd.reset(nil, 0)
	defer sb.reset()
	for {
		hdrs, ok, err := rd.read(sb.slot(), sb.hdrs)
		sb.hdrs = hdrs
		if !ok {
			if sb.n > 0 {
				d.DeliverBatch(sb.build(f.ps.id))
			}
			return rd.nextOffset(), err
		}
		if sb.add() {
			d.DeliverBatch(sb.build(f.ps.id))
			rd.release()
			if f.ps.paused.Load() {
				if rest := rd.rest(); len(rest) > 0 {
					f.rest, f.restAt = rest, rd.nextOffset()
				}
				return rd.nextOffset(), nil
			}
		}
	}
}

package kafka

// Fetching a source partition. Each assigned partition has a fetcher of its
// own: one connection to the partition's leader (found with a Metadata
// request to a bootstrap broker, never creating the topic), over which it
// sends its own Fetch requests and decodes their record batches
// (internal/wire), then copies the records into the engine's messages a
// slice at a time (messages.go). The response buffer is pooled between
// fetches. kafka-go (group membership, commits, offsets, metadata checks)
// is not on this path: its Client.Fetch decodes through a page buffer and
// allocates per message (BenchmarkConsume guards the difference).
//
// A fetch asks with MinBytes 1 and the source's MaxBytes and MaxWait (see
// wire.Fetch). An I/O error, or any partition error but OffsetOutOfRange,
// closes the connection, and the next try finds the leader again; a
// partition error is a kafka-go Error, so that the classification of
// liveness.go applies.

import (
	"context"
	"errors"
	"fmt"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire"
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
const fetchSlack = wire.Slack

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
	conn    *wire.Conn // nil until connected, and after an error
	epoch   int32      // the leader epoch Metadata gave, -1 if unknown
	version int16      // of Fetch
	req     *wire.Fetch
	rd      wire.BatchReader
	sb      sliceBuilder
	// rest is what the last response still held when the engine paused
	// the partition (the batches from the one being read), kept in conn's
	// response buffer until it is delivered: a resumed partition goes on
	// from it instead of fetching it again, so that a queue bound smaller
	// than a response does not make the broker send records several times.
	rest   []byte
	restAt int64 // the offset rest goes on from
}

func (s *Source) newFetcher(ps *partition) *fetcher {
	o := wire.FetchOptions{MinBytes: 1, MaxBytes: s.cfg.maxBytes, MaxWait: s.cfg.maxWait}
	return &fetcher{s: s, ps: ps, req: wire.NewFetch(s.topic, ps.id.ID, o)}
}

// drop closes the connection; the next fetch finds the leader again.
func (f *fetcher) drop() {
	if f.conn != nil {
		f.rest = nil
		f.conn.ReleaseBuf()
		f.conn.Close()
		f.conn = nil
	}
}

// connect finds the partition's leader and connects to it.
func (f *fetcher) connect(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, fetchSlack)
	defer cancel()
	dial := func(addr string) (*wire.Conn, error) { return wire.Dial(cctx, f.s.cfg.dialer, addr) }
	addr, epoch, c, err := wire.FindLeader(cctx, f.s.brokers, f.s.topic, f.ps.id.ID, dial, (*wire.Conn).Close)
	if err != nil {
		return err
	}
	if c == nil {
		if c, err = dial(addr); err != nil {
			return err
		}
	}
	v, err := wire.FetchVersion(c)
	if err != nil {
		c.Close()
		return err
	}
	f.conn, f.epoch, f.version = c, epoch, v
	return nil
}

// fetchOnce fetches the partition once from offset and delivers what came
// back, in DeliverBatch calls of up to deliverSlice messages, stopping
// early when the engine pauses it. It returns the offset to fetch next.
func (f *fetcher) fetchOnce(ctx context.Context, offset int64, d consumer.Dispatcher) (int64, error) {
	if f.conn != nil && f.conn.Stale() {
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
			f.conn.ReleaseBuf()
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
	conn := f.conn
	defer func() {
		if f.rest == nil {
			conn.ReleaseBuf() // after deliver copied the records out
		}
	}()
	batches, _, err := f.req.Send(ctx, conn, f.version, offset, f.epoch)
	if err != nil {
		if conn.Stale() {
			f.drop()
		}
		return offset, err
	}
	f.s.watch.seen()
	next, err := f.deliver(batches, offset, d)
	if err == nil && next == offset && len(batches) > 0 {
		err = fmt.Errorf("kafka: fetch %s/%d at offset %d from %s: the first record batch came back cut short (larger than MaxBytes %d?)", f.s.topic, f.ps.id.ID, offset, conn.Addr(), f.s.cfg.maxBytes)
	}
	return next, err
}

// deliver decodes batches and delivers their records at offset or later,
// in slices of deliverSlice, until the end or until the engine pauses the
// partition; then f.rest keeps what was not delivered. It returns the
// offset after what it passed.
func (f *fetcher) deliver(batches []byte, offset int64, d consumer.Dispatcher) (int64, error) {
	rd, sb := &f.rd, &f.sb
	rd.Reset(batches, offset)
	defer rd.Reset(nil, 0)
	defer sb.reset()
	for {
		hdrs, ok, err := rd.Read(sb.slot(), sb.hdrs)
		sb.hdrs = hdrs
		if !ok {
			if sb.n > 0 {
				d.DeliverBatch(sb.build(f.ps.id))
			}
			return rd.NextOffset(), err
		}
		if sb.add() {
			d.DeliverBatch(sb.build(f.ps.id))
			rd.Release()
			if f.ps.paused.Load() {
				if rest := rd.Rest(); len(rest) > 0 {
					f.rest, f.restAt = rest, rd.NextOffset()
				}
				return rd.NextOffset(), nil
			}
		}
	}
}

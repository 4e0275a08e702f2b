package kafka

// Reading records fetched with kafka-go's Client.Fetch, whose decoder keeps
// a header value's null apart from an empty one (kafka-go's Conn.ReadBatch
// reads both as nil). The spill log reads its topics this way (spill_read.go,
// spill_pending.go); the source's own fetch path is fetch.go. Also here: the
// kafka-go metadata helpers both use.

import (
	"context"
	"errors"
	"fmt"
	"io"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/metadata"
)

// walkRecords calls fn, in order, for each data record of rr at offset from
// or later, and closes rr. It returns the offset after the last record it
// passed, control records included (a transaction's commit markers take
// offsets too), so that a fetch holding only control records still moves
// on. An error of fn stops the walk; the returned offset is then the one
// after the last record fn accepted.
func walkRecords(rr kafkago.RecordReader, from int64, fn func(*kafkago.Record) error) (int64, error) {
	defer closeRecords(rr)
	next := from
	var readers []kafkago.RecordReader
	if st, ok := rr.(*protocol.RecordStream); ok {
		readers = st.Records
	} else {
		readers = []kafkago.RecordReader{rr}
	}
	for _, sub := range readers {
		_, control := sub.(*protocol.ControlBatch)
		for {
			r, err := sub.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return next, fmt.Errorf("kafka: decode records: %w", err)
			}
			if r.Offset < next {
				closeRecord(r)
				continue // a batch may start before the fetch offset
			}
			if control {
				closeRecord(r)
				next = r.Offset + 1
				continue
			}
			err = fn(r)
			closeRecord(r)
			if err != nil {
				return next, err
			}
			next = r.Offset + 1
		}
	}
	return next, nil
}

func closeRecord(r *kafkago.Record) {
	if r.Key != nil {
		r.Key.Close()
	}
	if r.Value != nil {
		r.Value.Close()
	}
}

func closeRecords(rr kafkago.RecordReader) {
	if c, ok := rr.(io.Closer); ok {
		_ = c.Close()
	}
}

// cacheMiss reports whether err is kafka-go's transport failing to route a
// request because its cached metadata (refreshed every 6s) does not know
// the topic or partition: the topic may have been created or grown since,
// or deleted.
func cacheMiss(err error) bool {
	return errors.Is(err, protocol.ErrNoTopic) || errors.Is(err, protocol.ErrNoPartition) || errors.Is(err, protocol.ErrNoLeader)
}

// topicShape is a topic's partition count and replication factor.
type topicShape struct {
	partitions  int
	replication int
}

// liveTopics asks one of brokers, directly and not through kafka-go's
// metadata cache, for every topic of the cluster and its shape. (A
// metadata request naming topics would ask the broker to auto-create them;
// one naming none never does.)
func liveTopics(ctx context.Context, dialer *kafkago.Dialer, brokers []string) (map[string]topicShape, error) {
	var errs []error
	for _, b := range brokers {
		conn, err := dialer.DialContext(ctx, "tcp", b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = conn.SetDeadline(dl)
		}
		parts, err := conn.ReadPartitions()
		_ = conn.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out := make(map[string]topicShape)
		for _, p := range parts {
			sh := out[p.Topic]
			sh.partitions++
			sh.replication = max(sh.replication, len(p.Replicas))
			out[p.Topic] = sh
		}
		return out, nil
	}
	return nil, fmt.Errorf("kafka: list topics: %w", errors.Join(errs...))
}

// refreshCache makes kafka-go's transport load topic into its metadata
// cache now instead of at its next periodic refresh. Call it only for a
// topic the cluster just said exists: kafka-go refreshes its cache on
// demand only for a metadata request that allows topic auto-creation.
func refreshCache(ctx context.Context, cl *kafkago.Client, topics ...string) {
	if len(topics) == 0 || cl.Transport == nil {
		return
	}
	_, _ = cl.Transport.RoundTrip(ctx, cl.Addr, &metadata.Request{TopicNames: topics, AllowAutoTopicCreation: true})
}

package wire

import (
	"context"
	"fmt"
	"math"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// FetchOptions shape a Fetch request.
type FetchOptions struct {
	MinBytes int           // what the broker waits for, up to MaxWait
	MaxBytes int           // for the request and the partition; a larger first batch still comes whole
	MaxWait  time.Duration // at least 1ms
}

// A Fetch is the Fetch request of one partition, kept from fetch to fetch
// with its response. It asks at the highest version in [4, 11] the broker
// supports (v12 is flexible, v13 names topics by ID) and reads
// uncommitted: a transaction's markers come back as control batches, which
// BatchReader passes over, and an aborted transaction's records are read.
// A Fetch is not safe for concurrent use.
type Fetch struct {
	topic string
	part  int32
	wait  time.Duration
	req   kmsg.FetchRequest
	resp  kmsg.FetchResponse
}

// NewFetch returns the Fetch request of topic/part.
func NewFetch(topic string, part int32, o FetchOptions) *Fetch {
	f := &Fetch{topic: topic, part: part, wait: o.MaxWait, req: kmsg.NewFetchRequest()}
	maxBytes := int32(min(o.MaxBytes, math.MaxInt32))
	f.req.MaxWaitMillis = int32(min(max(o.MaxWait.Milliseconds(), 1), math.MaxInt32))
	f.req.MinBytes = int32(min(o.MinBytes, math.MaxInt32))
	f.req.MaxBytes = maxBytes
	f.req.IsolationLevel = 0 // read uncommitted
	t := kmsg.NewFetchRequestTopic()
	t.Topic = topic
	p := kmsg.NewFetchRequestTopicPartition()
	p.Partition = part
	p.PartitionMaxBytes = maxBytes
	t.Partitions = []kmsg.FetchRequestTopicPartition{p}
	f.req.Topics = []kmsg.FetchRequestTopic{t}
	return f
}

// FetchVersion is the Fetch version to send to c's broker, or an error
// for a broker older than Kafka 0.11 (Fetch v4).
func FetchVersion(c *Conn) (int16, error) {
	v := c.Version(kmsg.Fetch)
	if v < 4 {
		return 0, fmt.Errorf("kafka: broker %s supports Fetch up to v%d; ringfence needs v4 (Kafka 0.11) or later", c.addr, v)
	}
	return min(v, 11), nil
}

// Send fetches the partition from offset over c, at version v, telling the
// broker the leader epoch the caller knows (-1: none), and returns the
// partition's record batches and high watermark. The batches point into
// c's response buffer until c.ReleaseBuf. It may take MaxWait+Slack; ctx
// cancellation aborts it at once. A broker's error is a kafka-go Error;
// after any error but OffsetOutOfRange c is Stale (a leader change, a
// stale epoch, a dropped connection), so the caller closes it and finds
// the leader again.
func (f *Fetch) Send(ctx context.Context, c *Conn, v int16, offset int64, epoch int32) (batches []byte, hw int64, err error) {
	f.req.Version = v
	rp := &f.req.Topics[0].Partitions[0]
	rp.FetchOffset = offset
	rp.CurrentLeaderEpoch = epoch
	if err := c.RoundTrip(ctx, &f.req, &f.resp, f.wait+Slack); err != nil {
		return nil, 0, err
	}
	failed := func(format string, args ...any) error {
		return fmt.Errorf("kafka: fetch %s/%d at offset %d from %s: "+format, append([]any{f.topic, f.part, offset, c.addr}, args...)...)
	}
	if f.resp.ErrorCode != 0 {
		c.broken = true
		return nil, 0, failed("%w", kafkago.Error(f.resp.ErrorCode))
	}
	var part *kmsg.FetchResponseTopicPartition
	for i := range f.resp.Topics {
		t := &f.resp.Topics[i]
		for j := range t.Partitions {
			if t.Topic == f.topic && t.Partitions[j].Partition == f.part {
				part = &t.Partitions[j]
			}
		}
	}
	if part == nil {
		c.broken = true
		return nil, 0, failed("no answer for the partition")
	}
	if part.ErrorCode != 0 {
		err := kafkago.Error(part.ErrorCode)
		// NotLeaderForPartition, FencedLeaderEpoch, ...: find the leader
		// again. OffsetOutOfRange is the caller's to resolve.
		c.broken = err != kafkago.OffsetOutOfRange
		return nil, 0, failed("%w", err)
	}
	return part.RecordBatches, part.HighWatermark, nil
}

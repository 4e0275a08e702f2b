package kafka

// Metadata through kafka-go: what its cache knows, and what the cluster
// says directly.

import (
	"context"
	"errors"
	"fmt"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/metadata"
)

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

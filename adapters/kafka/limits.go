package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	kafkago "github.com/segmentio/kafka-go"
)

// Kafka's message size limits, and how dead letters are sized from them.
//
// A broker refuses a record batch larger than the topic's max.message.bytes
// (default: the broker's message.max.bytes, 1048588 bytes unless set). A
// dead letter is the original message plus ringfence- headers: at most the
// error text (1 KiB), a few short fields and the tenant key, which may be as
// long as the message itself (a key taken from the message key or a
// header). So a DLQ topic is created with twice its source's limit plus
// dlqHeadroom, and a record that still does not fit raises the topic's
// limit (see DLQ.Write).
const (
	// defaultMaxMessageBytes is Kafka's default message.max.bytes, used
	// when neither the topic's nor the broker's limit can be read.
	defaultMaxMessageBytes = 1048588
	// dlqHeadroom is room for the ringfence- headers on top of twice the
	// source's limit.
	dlqHeadroom = 64 << 10
	// batchOverhead is the size of a v2 record batch without its records.
	batchOverhead = 61
	// maxTopicLimit caps a DLQ topic's max.message.bytes: a produce request
	// must also fit the broker's socket.request.max.bytes (100 MiB by
	// default).
	maxTopicLimit = 100 << 20
)

// dlqLimit is the max.message.bytes a DLQ topic gets for a source whose
// limit is src.
func dlqLimit(src int) int {
	return min(2*src+dlqHeadroom, maxTopicLimit)
}

// batchSize is the exact size on the wire of a v2 record batch holding m
// alone: what a broker compares with max.message.bytes.
func batchSize(m *kafkago.Message) int {
	return batchOverhead + recordSize(m)
}

// recordSize is the size of m as one record of a v2 batch (offset and
// timestamp deltas of 0), length prefix included.
func recordSize(m *kafkago.Message) int {
	return recordSizeAt(recordBody(m.Key, m.Value, m.Headers), 0)
}

// recordBody is the size of a record's body without its offset delta
// (attributes, a timestamp delta of 0, key, value and headers).
func recordBody(key, value []byte, headers []kafkago.Header) int {
	body := 1 + varintLen(0) // attributes, timestamp delta
	body += nullableLen(key) + nullableLen(value)
	body += varintLen(int64(len(headers)))
	for _, h := range headers {
		body += varintLen(int64(len(h.Key))) + len(h.Key) + nullableLen(h.Value)
	}
	return body
}

// recordSizeAt is the size on the wire, length prefix included, of a
// record whose body (see recordBody) is body, at offset delta i of its
// batch (all records of the batch sharing one timestamp).
func recordSizeAt(body, i int) int {
	body += varintLen(int64(i))
	return varintLen(int64(body)) + body
}

func nullableLen(b []byte) int {
	if b == nil {
		return varintLen(-1)
	}
	return varintLen(int64(len(b))) + len(b)
}

// varintLen is the length of v as a zigzag varint.
func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

// configSourceTopic is DescribeConfigs' DYNAMIC_TOPIC_CONFIG: a value set
// on the topic itself.
const configSourceTopic = 1

// limitOf returns the config's value in a DescribeConfigs resource.
func limitOf(res kafkago.DescribeConfigResponseResource, name string) (n int, source int8, ok bool) {
	for _, e := range res.ConfigEntries {
		if e.ConfigName == name {
			n, err := strconv.Atoi(e.ConfigValue)
			return n, e.ConfigSource, err == nil && n > 0
		}
	}
	return 0, 0, false
}

// topicLimit reads topic's effective max.message.bytes. A topic that does
// not exist, or whose configuration may not be read, falls back to the
// broker's message.max.bytes and then to Kafka's default; an error is
// returned only for a failure to reach the cluster at all.
func topicLimit(ctx context.Context, cl *kafkago.Client, topic string) (int, error) {
	resp, err := cl.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{
		Resources: []kafkago.DescribeConfigRequestResource{{
			ResourceType: kafkago.ResourceTypeTopic,
			ResourceName: topic,
			ConfigNames:  []string{"max.message.bytes", "message.max.bytes"},
		}},
	})
	if err != nil {
		return 0, fmt.Errorf("kafka: describe topic %s: %w", topic, err)
	}
	for _, res := range resp.Resources {
		if res.ResourceName != topic || res.Error != nil {
			continue
		}
		// Kafka reports the effective max.message.bytes of a topic. Some
		// brokers (kfake) report the topic default there and a broker
		// override under the broker's name: a value not set on the topic
		// then gives way to the broker's.
		n, src, ok := limitOf(res, "max.message.bytes")
		if b, _, bok := limitOf(res, "message.max.bytes"); bok && (!ok || src != configSourceTopic) {
			return b, nil
		}
		if ok {
			return n, nil
		}
	}
	return brokerLimit(ctx, cl)
}

// brokerLimit reads the controller's message.max.bytes, or Kafka's default
// when it may not be read.
func brokerLimit(ctx context.Context, cl *kafkago.Client) (int, error) {
	md, err := cl.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{}})
	if err != nil {
		return 0, fmt.Errorf("kafka: metadata: %w", err)
	}
	id := md.Controller.ID
	if md.Controller.Host == "" && len(md.Brokers) > 0 {
		id = md.Brokers[0].ID
	}
	// kafka-go sends a broker resource to that broker.
	resp, err := cl.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{
		Resources: []kafkago.DescribeConfigRequestResource{{
			ResourceType: kafkago.ResourceTypeBroker,
			ResourceName: strconv.Itoa(id),
			ConfigNames:  []string{"message.max.bytes"},
		}},
	})
	if err == nil {
		for _, res := range resp.Resources {
			if res.Error == nil {
				if n, _, ok := limitOf(res, "message.max.bytes"); ok {
					return n, nil
				}
			}
		}
	}
	return defaultMaxMessageBytes, nil
}

// setTopicLimit sets topic's max.message.bytes to n.
func setTopicLimit(ctx context.Context, cl *kafkago.Client, topic string, n int) error {
	resp, err := cl.IncrementalAlterConfigs(ctx, &kafkago.IncrementalAlterConfigsRequest{
		Resources: []kafkago.IncrementalAlterConfigsRequestResource{{
			ResourceType: kafkago.ResourceTypeTopic,
			ResourceName: topic,
			Configs: []kafkago.IncrementalAlterConfigsRequestConfig{{
				Name: "max.message.bytes", Value: strconv.Itoa(n), ConfigOperation: kafkago.ConfigOperationSet,
			}},
		}},
	})
	if err != nil {
		return fmt.Errorf("kafka: raise max.message.bytes of %s to %d: %w", topic, n, err)
	}
	for _, res := range resp.Resources {
		if res.Error != nil {
			return fmt.Errorf("kafka: raise max.message.bytes of %s to %d: %w", topic, n, res.Error)
		}
	}
	return nil
}

// refused reports whether err is the broker refusing a request for good
// (policy, permissions, configuration), as opposed to being unreachable.
func refused(err error) bool {
	for _, e := range []error{
		kafkago.PolicyViolation, kafkago.InvalidConfiguration, kafkago.InvalidRequest,
		kafkago.TopicAuthorizationFailed, kafkago.ClusterAuthorizationFailed,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

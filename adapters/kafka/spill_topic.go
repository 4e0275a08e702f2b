package kafka

// Creating the spill topic (shaped like the source, sized for its largest
// message plus the spill headers, never compacted) and the cursor topic
// (compacted).

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire"
	"github.com/ringfence/ringfence/dlq"
)

// spillLimit is the max.message.bytes a spill topic gets for a source whose
// limit is src: as a DLQ topic's, twice the source's plus 64 KiB, since a
// spill record is the message plus headers that may hold the tenant key (as
// long as the message when it came from the message) and the source topic.
func spillLimit(src int) int { return dlqLimit(src) }

// topic returns what the log knows of topic, creating it on first use
// (single-flight per topic, no lock shared with other topics). A source
// partition the topic does not have (the source grew) grows it.
func (s *SpillLog) topic(ctx context.Context, topic string, part int) (spillTopic, error) {
	ensure := func(ctx context.Context) (spillTopic, error) { return s.ensure(ctx, topic) }
	t, err := s.topics.Do(ctx, topic, ensure)
	if err != nil || part < t.partitions {
		return t, err
	}
	s.sources.Forget(s.source, nil)
	s.topics.Forget(topic, nil)
	if t, err = s.topics.Do(ctx, topic, ensure); err != nil {
		return t, err
	}
	if part >= t.partitions {
		return t, fmt.Errorf("kafka: spill topic %s has %d partitions, source partition %d has none: %w", topic, t.partitions, part, kafkago.UnknownTopicOrPartition)
	}
	return t, nil
}

// sourceInfo reads the source topic's shape, max.message.bytes and
// retention.ms once.
func (s *SpillLog) sourceInfo(ctx context.Context) (spillSource, error) {
	return s.sources.Do(ctx, s.source, func(ctx context.Context) (spillSource, error) {
		live, err := liveTopics(ctx, s.cfg.dialer, s.brokers)
		if err != nil {
			return spillSource{}, err
		}
		sh, ok := live[s.source]
		if !ok {
			return spillSource{}, fmt.Errorf("kafka: spill log of %s: %w", s.source, kafkago.UnknownTopicOrPartition)
		}
		limit, err := topicLimit(ctx, s.client, s.source)
		if err != nil {
			return spillSource{}, err
		}
		retention, _ := topicConfig(ctx, s.client, s.source, "retention.ms")
		return spillSource{partitions: sh.partitions, replication: max(sh.replication, 1), limit: limit, retention: retention}, nil
	})
}

// ensure creates topic like the source, or reads the settings of the
// existing topic (growing it to the source's partition count).
func (s *SpillLog) ensure(ctx context.Context, topic string) (spillTopic, error) {
	src, err := s.sourceInfo(ctx)
	if err != nil {
		return spillTopic{}, err
	}
	t := spillTopic{partitions: src.partitions, limit: spillLimit(src.limit)}
	repl := src.replication
	if s.cfg.replication > 0 {
		repl = s.cfg.replication
	}
	configs := []kafkago.ConfigEntry{
		{ConfigName: "max.message.bytes", ConfigValue: strconv.Itoa(t.limit)},
		// A compacted spill topic would keep one record per original key:
		// never inherit a broker default of "compact".
		{ConfigName: "cleanup.policy", ConfigValue: "delete"},
	}
	switch {
	case s.cfg.retention < 0:
		configs = append(configs, kafkago.ConfigEntry{ConfigName: "retention.ms", ConfigValue: "-1"})
	case s.cfg.retention > 0:
		configs = append(configs, kafkago.ConfigEntry{ConfigName: "retention.ms", ConfigValue: strconv.FormatInt(s.cfg.retention.Milliseconds(), 10)})
	case src.retention != "":
		configs = append(configs, kafkago.ConfigEntry{ConfigName: "retention.ms", ConfigValue: src.retention})
	}
	created, err := createTopicWith(ctx, s.client, topic, src.partitions, repl, configs...)
	if err != nil {
		return t, err
	}
	if created {
		s.stats.created.Add(1)
		return t, nil
	}
	// It exists (another process made it, or an earlier run): it keeps its
	// settings. Our metadata cache may not know it yet.
	live, err := liveTopics(ctx, s.cfg.dialer, s.brokers)
	if err != nil {
		return t, err
	}
	sh, ok := live[topic]
	if !ok {
		return t, fmt.Errorf("kafka: spill topic %s exists and does not: deleted meanwhile? %w", topic, kafkago.UnknownTopicOrPartition)
	}
	refreshCache(ctx, s.client, topic)
	if topic == s.shared {
		if err := s.checkShared(ctx); err != nil {
			return t, err
		}
	}
	if t.limit, err = topicLimit(ctx, s.client, topic); err != nil {
		return t, err
	}
	t.partitions = sh.partitions
	if sh.partitions < src.partitions {
		if err := growTopic(ctx, s.client, topic, src.partitions); err != nil {
			return t, err
		}
		t.partitions = src.partitions
	}
	return t, nil
}

// checkShared refuses an existing spill topic that is not one: compacted
// (a compacted topic would keep one record per key), or whose last record
// of partition 0 is not a spill record.
func (s *SpillLog) checkShared(ctx context.Context) error {
	if policy, ok := topicConfig(ctx, s.client, s.shared, "cleanup.policy"); ok && strings.Contains(policy, "compact") {
		return fmt.Errorf("kafka: %s has cleanup.policy=%s: %w; refusing to spill to it", s.shared, policy, ErrNotSpill)
	}
	first, last, err := s.bounds(ctx, s.shared, 0)
	if err != nil || last <= first {
		return err
	}
	foreign := false
	o := wire.FetchOptions{MaxBytes: s.cfg.fetchBytes, MaxWait: fetchSlack}
	_, _, err = s.records.Fetch(ctx, s.shared, 0, last-1, o, func(r *wire.Record, hs []wire.Header) error {
		if _, ok := decodeSpill(fetchedOf(r, hs), s.source); !ok {
			foreign = true
		}
		return wire.ErrStop
	})
	if err != nil {
		return fmt.Errorf("kafka: check spill topic %s: %w", s.shared, err)
	}
	if foreign {
		return fmt.Errorf("kafka: %s holds a record that is not a spill record (partition 0, offset %d): %w; refusing to spill to it", s.shared, last-1, ErrNotSpill)
	}
	return nil
}

// cursorTopic makes sure the cursor topic exists (single-flight): compacted,
// with the source's partition count and replication factor.
func (s *SpillLog) cursorTopic(ctx context.Context) (spillTopic, error) {
	return s.topics.Do(ctx, s.cursorLog, func(ctx context.Context) (spillTopic, error) {
		src, err := s.sourceInfo(ctx)
		if err != nil {
			return spillTopic{}, err
		}
		repl := src.replication
		if s.cfg.replication > 0 {
			repl = s.cfg.replication
		}
		created, err := createTopicWith(ctx, s.client, s.cursorLog, src.partitions, repl,
			kafkago.ConfigEntry{ConfigName: "cleanup.policy", ConfigValue: "compact"})
		if err != nil {
			return spillTopic{}, err
		}
		t := spillTopic{partitions: src.partitions}
		if created {
			s.stats.created.Add(1)
			return t, nil
		}
		live, err := liveTopics(ctx, s.cfg.dialer, s.brokers)
		if err != nil {
			return t, err
		}
		refreshCache(ctx, s.client, s.cursorLog)
		if n := live[s.cursorLog].partitions; n < src.partitions {
			if err := growTopic(ctx, s.client, s.cursorLog, src.partitions); err != nil {
				return t, err
			}
		}
		return t, nil
	})
}

// growTopic raises topic's partition count to n.
func growTopic(ctx context.Context, cl *kafkago.Client, topic string, n int) error {
	resp, err := cl.CreatePartitions(ctx, &kafkago.CreatePartitionsRequest{
		Topics: []kafkago.TopicPartitionsConfig{{Name: topic, Count: int32(n)}},
	})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil && !errors.Is(err, kafkago.InvalidPartitionNumber) { // InvalidPartitionNumber: grown meanwhile
		return fmt.Errorf("kafka: grow spill topic %s to %d partitions: %w", topic, n, err)
	}
	return nil
}

// topicConfig reads one configuration value of topic; ok is false when it
// may not be read.
func topicConfig(ctx context.Context, cl *kafkago.Client, topic, name string) (string, bool) {
	resp, err := cl.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{
		Resources: []kafkago.DescribeConfigRequestResource{{
			ResourceType: kafkago.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{name},
		}},
	})
	if err != nil {
		return "", false
	}
	for _, res := range resp.Resources {
		if res.ResourceName != topic || res.Error != nil {
			continue
		}
		for _, e := range res.ConfigEntries {
			if e.ConfigName == name && e.ConfigValue != "" {
				return e.ConfigValue, true
			}
		}
	}
	return "", false
}

// splitSpillTopic returns the token of a spill topic of source, and false
// for any other name (the source's DLQ topics, another source's topics,
// spill topics of a source whose name extends this one's).
func splitSpillTopic(source, topic string) (token string, ok bool) {
	tok, found := strings.CutPrefix(topic, source+SpillInfix)
	if !found || tok == "" || strings.IndexByte(tok, '.') >= 0 {
		return "", false
	}
	if _, _, err := dlq.ParseTenantToken(tok); err != nil {
		return "", false
	}
	return tok, true
}

package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Kafka record conventions of the fleet topics.
const (
	// HeaderFleet is the header every record of a fleet topic carries;
	// its value is the topic's kind ("status" or "control"). A record
	// without it makes the topic not a fleet table (ErrNotFleet).
	HeaderFleet = "ringfence-fleet"
	// markerKey is the key of the record written first into a new fleet
	// topic, so that an empty topic made by ringfence is known as one. It
	// is no token (a token's '_' is followed by hex digits or "none"), so
	// it never names a tenant or a process.
	markerKey = "_ringfence"
	// kafkaFetchWait bounds how long a watch's fetch waits for new records
	// (a record that arrives ends the wait at once).
	kafkaFetchWait = 500 * time.Millisecond
	// statusSegmentMs is the status topic's segment.ms.
	statusSegmentMs = 60_000
)

// KafkaOptions configure NewKafkaStore.
type KafkaOptions struct {
	// Create makes the topics (one partition, cleanup.policy=compact) when
	// they do not exist; without it a missing topic is ErrNoTable.
	Create bool
	// ClientOpts are added to the kgo clients' options (TLS, SASL, ...).
	ClientOpts []kgo.Opt
}

// KafkaTopic names a group's topic of kind: "<group>.ringfence-status" or
// "<group>.ringfence-control".
func KafkaTopic(group string, kind Kind) string {
	return group + ".ringfence-" + kind.String()
}

type kafkaStore struct {
	seeds []string
	opts  []kgo.Opt
	cl    *kgo.Client // produces and asks metadata
	group string
}

// NewKafkaStore opens (with opts.Create, makes) the group's two compacted
// topics. A topic that is not compacted, or whose first record lacks
// HeaderFleet, is refused with ErrNotFleet; so is a watch that meets a
// record without it.
func NewKafkaStore(ctx context.Context, seeds []string, group string, opts KafkaOptions) (Store, error) {
	if err := checkKafkaGroup(group); err != nil {
		return nil, err
	}
	base := append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts.ClientOpts...)
	cl, err := kgo.NewClient(append(slices.Clone(base), kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))...)
	if err != nil {
		return nil, fmt.Errorf("fleet: kafka client: %w", err)
	}
	s := &kafkaStore{seeds: seeds, opts: base, cl: cl, group: group}
	for _, kind := range []Kind{KindStatus, KindControl} {
		if err := s.open(ctx, kind, opts.Create); err != nil {
			cl.Close()
			return nil, err
		}
	}
	return s, nil
}

func checkKafkaGroup(g string) error {
	if g == "" || len(KafkaTopic(g, KindControl)) > 249 {
		return fmt.Errorf("fleet: group %q does not make a Kafka topic name (1 to %d characters)", g, 249-len(".ringfence-control"))
	}
	for i := 0; i < len(g); i++ {
		c := g[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("fleet: group %q does not make a Kafka topic name (character %q not in [a-zA-Z0-9._-])", g, c)
		}
	}
	return nil
}

// open makes sure the kind's topic exists and is a fleet table.
func (s *kafkaStore) open(ctx context.Context, kind Kind, create bool) error {
	topic := KafkaTopic(s.group, kind)
	parts, err := s.partitions(ctx, topic)
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		if !create {
			return fmt.Errorf("%w: no topic %s (no process of group %q has run an agent)", ErrNoTable, topic, s.group)
		}
		return s.create(ctx, kind, topic)
	}
	if err != nil {
		return err
	}
	if err := s.checkCompacted(ctx, topic); err != nil {
		return err
	}
	return s.checkFirst(ctx, kind, topic, parts)
}

func (s *kafkaStore) partitions(ctx context.Context, topic string) ([]int32, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = false
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return nil, fmt.Errorf("fleet: metadata of %s: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return nil, fmt.Errorf("fleet: metadata of %s: %d topics in the answer", topic, len(resp.Topics))
	}
	t := resp.Topics[0]
	if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
		return nil, fmt.Errorf("fleet: topic %s: %w", topic, err)
	}
	ps := make([]int32, 0, len(t.Partitions))
	for _, p := range t.Partitions {
		ps = append(ps, p.Partition)
	}
	slices.Sort(ps)
	return ps, nil
}

func (s *kafkaStore) create(ctx context.Context, kind Kind, topic string) error {
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic = topic
	rt.NumPartitions = 1
	rt.ReplicationFactor = -1
	configs := [][2]string{{"cleanup.policy", "compact"}}
	if kind == KindStatus {
		// Heartbeats come every second from every process: roll the
		// segment every minute so that compaction (which skips the active
		// segment) keeps the topic to about a minute of heartbeats plus
		// one record per process.
		configs = append(configs, [2]string{"segment.ms", strconv.Itoa(statusSegmentMs)})
	}
	for _, c := range configs {
		cfg := kmsg.NewCreateTopicsRequestTopicConfig()
		cfg.Name, cfg.Value = c[0], kmsg.StringPtr(c[1])
		rt.Configs = append(rt.Configs, cfg)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return fmt.Errorf("fleet: create topic %s: %w", topic, err)
	}
	for _, t := range resp.Topics {
		err := kerr.ErrorForCode(t.ErrorCode)
		if errors.Is(err, kerr.TopicAlreadyExists) {
			return s.open(ctx, kind, false) // made by another process meanwhile
		}
		if err != nil {
			return fmt.Errorf("fleet: create topic %s: %w", topic, err)
		}
	}
	return s.put(ctx, kind, markerKey, []byte("ringfence fleet "+kind.String()+" table"))
}

func (s *kafkaStore) checkCompacted(ctx context.Context, topic string) error {
	req := kmsg.NewPtrDescribeConfigsRequest()
	r := kmsg.NewDescribeConfigsRequestResource()
	r.ResourceType = kmsg.ConfigResourceTypeTopic
	r.ResourceName = topic
	r.ConfigNames = []string{"cleanup.policy"}
	req.Resources = append(req.Resources, r)
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return fmt.Errorf("fleet: configs of %s: %w", topic, err)
	}
	for _, res := range resp.Resources {
		if err := kerr.ErrorForCode(res.ErrorCode); err != nil {
			return fmt.Errorf("fleet: configs of %s: %w", topic, err)
		}
		for _, c := range res.Configs {
			if c.Name == "cleanup.policy" && c.Value != nil && strings.Contains(*c.Value, "compact") {
				return nil
			}
		}
	}
	return fmt.Errorf("%w: topic %s is not compacted (cleanup.policy has no compact); refusing to touch it", ErrNotFleet, topic)
}

// offsets returns each partition's start and end offsets.
func (s *kafkaStore) offsets(ctx context.Context, topic string, parts []int32) (start, end map[int32]int64, err error) {
	start, end = map[int32]int64{}, map[int32]int64{}
	for _, ts := range []int64{-2, -1} {
		req := kmsg.NewPtrListOffsetsRequest()
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		for _, p := range parts {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition, rp.Timestamp = p, ts
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
		for _, shard := range s.cl.RequestSharded(ctx, req) {
			if shard.Err != nil {
				return nil, nil, fmt.Errorf("fleet: offsets of %s: %w", topic, shard.Err)
			}
			for _, t := range shard.Resp.(*kmsg.ListOffsetsResponse).Topics {
				for _, p := range t.Partitions {
					if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
						return nil, nil, fmt.Errorf("fleet: offsets of %s/%d: %w", topic, p.Partition, err)
					}
					if ts == -2 {
						start[p.Partition] = p.Offset
					} else {
						end[p.Partition] = p.Offset
					}
				}
			}
		}
	}
	return start, end, nil
}

// checkFirst reads the first record of each non-empty partition: it must
// carry HeaderFleet with kind.
func (s *kafkaStore) checkFirst(ctx context.Context, kind Kind, topic string, parts []int32) error {
	start, end, err := s.offsets(ctx, topic, parts)
	if err != nil {
		return err
	}
	want := map[int32]kgo.Offset{}
	for _, p := range parts {
		if end[p] > start[p] {
			want[p] = kgo.NewOffset().At(start[p])
		}
	}
	if len(want) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(append(slices.Clone(s.opts), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: want}), kgo.FetchMaxWait(kafkaFetchWait))...)
	if err != nil {
		return fmt.Errorf("fleet: kafka client: %w", err)
	}
	defer cl.Close()
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("fleet: reading %s: %w", topic, err)
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return fmt.Errorf("fleet: reading %s: %w", topic, ferr)
		}
		var bad error
		fs.EachRecord(func(r *kgo.Record) {
			if _, ok := want[r.Partition]; !ok {
				return
			}
			delete(want, r.Partition)
			if err := checkHeader(kind, r); err != nil && bad == nil {
				bad = err
			}
		})
		if bad != nil {
			return bad
		}
	}
	return nil
}

func checkHeader(kind Kind, r *kgo.Record) error {
	for _, h := range r.Headers {
		if h.Key == HeaderFleet {
			if string(h.Value) == kind.String() {
				return nil
			}
			return fmt.Errorf("%w: topic %s holds a record of kind %q (partition %d, offset %d), want %q; refusing to touch it", ErrNotFleet, r.Topic, h.Value, r.Partition, r.Offset, kind.String())
		}
	}
	return fmt.Errorf("%w: topic %s holds a record without a %s header (partition %d, offset %d); refusing to touch it", ErrNotFleet, r.Topic, HeaderFleet, r.Partition, r.Offset)
}

func (s *kafkaStore) put(ctx context.Context, kind Kind, key string, value []byte) error {
	r := &kgo.Record{
		Topic:   KafkaTopic(s.group, kind),
		Key:     []byte(key),
		Value:   value,
		Headers: []kgo.RecordHeader{{Key: HeaderFleet, Value: []byte(kind.String())}},
	}
	if err := s.cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		return fmt.Errorf("fleet: write %s %s: %w", kind, key, err)
	}
	return nil
}

func (s *kafkaStore) Put(ctx context.Context, kind Kind, key string, value []byte) error {
	return s.put(ctx, kind, key, nonNil(value))
}

func (s *kafkaStore) Delete(ctx context.Context, kind Kind, key string) error {
	return s.put(ctx, kind, key, nil)
}

func (s *kafkaStore) Watch(ctx context.Context, kind Kind) (<-chan Update, error) {
	topic := KafkaTopic(s.group, kind)
	parts, err := s.partitions(ctx, topic)
	if err != nil {
		return nil, err
	}
	start, end, err := s.offsets(ctx, topic, parts)
	if err != nil {
		return nil, err
	}
	from := map[int32]kgo.Offset{}
	for _, p := range parts {
		from[p] = kgo.NewOffset().At(start[p])
	}
	cl, err := kgo.NewClient(append(slices.Clone(s.opts), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}), kgo.FetchMaxWait(kafkaFetchWait))...)
	if err != nil {
		return nil, fmt.Errorf("fleet: kafka client: %w", err)
	}
	out := make(chan Update, watchBuffer)
	go func() {
		defer close(out)
		defer cl.Close()
		send := func(u Update) bool { return sendUpdate(ctx, out, u) }
		pos := start
		caughtUp := func() bool {
			for _, p := range parts {
				if pos[p] < end[p] {
					return false
				}
			}
			return true
		}
		loaded := caughtUp()
		if loaded && !send(Update{Loaded: true}) {
			return
		}
		for {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			var ferr error
			fs.EachError(func(_ string, _ int32, err error) {
				if ferr == nil && !errors.Is(err, context.Canceled) {
					ferr = err
				}
			})
			if ferr != nil {
				send(Update{Err: fmt.Errorf("fleet: reading %s: %w", topic, ferr)})
				return
			}
			ok := true
			fs.EachRecord(func(r *kgo.Record) {
				if !ok {
					return
				}
				if err := checkHeader(kind, r); err != nil {
					send(Update{Err: err})
					ok = false
					return
				}
				pos[r.Partition] = r.Offset + 1
				if string(r.Key) == markerKey {
					return
				}
				ok = send(Update{Key: string(r.Key), Value: r.Value})
			})
			if !ok {
				return
			}
			if !loaded && caughtUp() {
				loaded = true
				if !send(Update{Loaded: true}) {
					return
				}
			}
		}
	}()
	return out, nil
}

func (s *kafkaStore) Close() error {
	s.cl.Close()
	return nil
}

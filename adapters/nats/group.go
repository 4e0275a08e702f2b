package nats

// Scale-out: a Source as one member of a static partitioned consumer group
// (Synadia's pcgroups), and a plain durable shared by several processes as
// a pinned-client priority group. Both give a partition's messages to one
// process at a time; the server's pin decides which.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/ringfence/ringfence/consumer"
)

// ErrConsumerGroup: a partitioned consumer group cannot be used: it does
// not exist, the member is not in it, its stream does not put a partition
// number first in its subjects, or its configuration changed while a
// Source consumed it.
var ErrConsumerGroup = errors.New("nats: unusable consumer group")

// pcgroups' names: the priority group its member consumers pull in, the KV
// bucket of static group configurations.
const (
	groupPriority = "PCG"
	groupBucket   = "static-consumer-groups"
	// pinnedGroup is the priority group PinDurable gives a plain durable.
	pinnedGroup = "ringfence"
	// pinHeader is the header the server stamps on a pinned client's
	// messages.
	pinHeader = "Nats-Pin-Id"
)

// WithConsumerGroup makes Open join the static partitioned consumer group
// group (github.com/synadia-io/orbit.go/pcgroups; see
// CreateConsumerGroup) as member, instead of binding a durable: pass ""
// as Open's durable. The Source consumes the member's consumer,
// "<group>-<member>", created if missing (as pcgroups.StaticConsume
// does), which filters the member's partitions and is a pinned-client
// priority group: of several processes running the same member, one at a
// time gets messages; the others are hot standbys. Each partition N is its
// own engine partition, Partition{Topic: "<stream>/<group>", ID: N},
// reported with Assigned only once this process is the pinned one (its
// first message carries the server's pin) and with Revoked when it stops
// being it (the server answers "pin ID mismatch"), when Run ends, and
// before Run returns on a change of the group's configuration. Message.Topic
// is the subject without the partition token, as pcgroups hands it to
// handlers, so FromSubjectToken counts as on the unpartitioned subject.
func WithConsumerGroup(group, member string) SourceOption {
	return func(o *sourceOptions) error {
		if err := validStreamName(group); err != nil {
			return fmt.Errorf("consumer group: %w", err)
		}
		if err := validStreamName(member); err != nil {
			return fmt.Errorf("consumer group member: %w", err)
		}
		o.group, o.member = group, member
		return nil
	}
}

// WithGroupConsumerConfig is the template of the member consumer that
// WithConsumerGroup creates (names, filters and priority settings are
// set by the Source; AckPolicy must be explicit). Its AckWait also sets
// how fast a standby takes over (see PinnedTTL). Default: explicit acks,
// AckWait 5s (pcgroups' default), MaxDeliver unlimited, the server's
// MaxAckPending (1000).
func WithGroupConsumerConfig(cfg jetstream.ConsumerConfig) SourceOption {
	return func(o *sourceOptions) error {
		if cfg.AckPolicy != jetstream.AckExplicitPolicy {
			return fmt.Errorf("%w: group consumer ack policy %v, want explicit", ErrInvalidOption, cfg.AckPolicy)
		}
		if cfg.AckWait < 0 {
			return fmt.Errorf("%w: group consumer AckWait %v is negative", ErrInvalidOption, cfg.AckWait)
		}
		c := cfg
		o.groupConfig = &c
		return nil
	}
}

// WithPinnedClient makes NewSource (and Open) turn a plain durable into a
// pinned-client priority group (PinDurable) if it is not one yet, so that
// several processes bound to it take turns instead of sharing its
// messages. A durable that already is one is used that way without this
// option.
func WithPinnedClient() SourceOption {
	return func(o *sourceOptions) error {
		o.pin = true
		return nil
	}
}

// PinnedTTL is how long the server keeps a pinned client that sends no
// pull request: AckWait plus the larger of AckWait and 2s (twice AckWait
// from 2s on). A standby takes over a dead process's partitions after it.
// The Source pulls at least every half AckWait (1s at least) and extends
// what it holds every third of AckWait, so what a dead process held comes
// back after at most AckWait, at least half an AckWait (1s) before the
// standby is pinned: the standby gets it ahead of newer messages.
func PinnedTTL(ackWait time.Duration) time.Duration { return ackWait + max(ackWait, 2*time.Second) }

// PinDurable makes the durable consumer durable on stream a pinned-client
// priority group (PinnedTTL of its AckWait), so that of several processes
// bound to it one at a time gets messages. A durable that already has a
// pinned priority group is left as it is; one with another priority
// policy is refused (ErrConsumerConfig).
func PinDurable(ctx context.Context, js jetstream.JetStream, stream, durable string) error {
	cons, err := js.Consumer(ctx, stream, durable)
	if err != nil {
		return fmt.Errorf("nats: consumer %s/%s: %w", stream, durable, err)
	}
	_, err = pinDurable(ctx, js, cons.CachedInfo())
	return err
}

// pinDurable returns the priority group the durable pins its client in,
// after making it one if needed.
func pinDurable(ctx context.Context, js jetstream.JetStream, info *jetstream.ConsumerInfo) (string, error) {
	cfg := info.Config
	switch cfg.PriorityPolicy {
	case jetstream.PriorityPolicyPinned:
		return cfg.PriorityGroups[0], nil
	case jetstream.PriorityPolicyNone:
	default:
		return "", fmt.Errorf("%w: priority policy %v shares the durable's messages between processes; want none or pinned_client", ErrConsumerConfig, cfg.PriorityPolicy)
	}
	cfg.PriorityGroups = []string{pinnedGroup}
	cfg.PriorityPolicy = jetstream.PriorityPolicyPinned
	cfg.PinnedTTL = PinnedTTL(cfg.AckWait)
	if _, err := js.UpdateConsumer(ctx, info.Stream, cfg); err != nil {
		return "", fmt.Errorf("nats: make %s/%s a pinned priority group: %w", info.Stream, cfg.Durable, err)
	}
	return pinnedGroup, nil
}

// PartitionTransform returns the stream subject transform a static
// consumer group needs: subjects matching source (tokens and '*'
// wildcards, no '>') are stored as "<partition>.<subject>", the partition
// partition(n, ...) of the wildcards numbered in wildcards (1-based, the
// tenant-bearing ones). Set it as the stream's SubjectTransform.
func PartitionTransform(source string, n int, wildcards ...int) (jetstream.SubjectTransformConfig, error) {
	if n < 1 {
		return jetstream.SubjectTransformConfig{}, fmt.Errorf("%w: %d partitions", ErrInvalidOption, n)
	}
	if err := validPrefix(strings.ReplaceAll(source, "*", "x")); err != nil || strings.Contains(source, ">") {
		return jetstream.SubjectTransformConfig{}, fmt.Errorf("%w: transform source %q: tokens and '*' only", ErrInvalidOption, source)
	}
	toks := strings.Split(source, ".")
	stars := 0
	for i, t := range toks {
		if t == "*" {
			stars++
			toks[i] = "{{wildcard(" + strconv.Itoa(stars) + ")}}"
		} else if strings.Contains(t, "*") {
			return jetstream.SubjectTransformConfig{}, fmt.Errorf("%w: transform source %q: token %q", ErrInvalidOption, source, t)
		}
	}
	if len(wildcards) == 0 {
		return jetstream.SubjectTransformConfig{}, fmt.Errorf("%w: no wildcard to partition on", ErrInvalidOption)
	}
	args := []string{strconv.Itoa(n)}
	for _, w := range wildcards {
		if w < 1 || w > stars {
			return jetstream.SubjectTransformConfig{}, fmt.Errorf("%w: wildcard %d: %q has %d", ErrInvalidOption, w, source, stars)
		}
		args = append(args, strconv.Itoa(w))
	}
	dest := "{{partition(" + strings.Join(args, ",") + ")}}." + strings.Join(toks, ".")
	return jetstream.SubjectTransformConfig{Source: source, Destination: dest}, nil
}

// CreateConsumerGroup creates the static partitioned consumer group group
// on stream with pcgroups.CreateStatic, its partitions spread evenly over
// members (pcgroups' balanced mapping); the partition count is the
// stream's (PartitionTransform). It is idempotent for the same members
// and fails for different ones: a static group's membership is fixed
// (delete it with pcgroups.DeleteStatic and create it again to change
// it). The `cg` CLI of pcgroups does the same: `cg static create balanced
// <stream> <group> <n> '>' <members...>`.
func CreateConsumerGroup(ctx context.Context, js jetstream.JetStream, stream, group string, members ...string) error {
	if err := validStreamName(group); err != nil {
		return fmt.Errorf("consumer group: %w", err)
	}
	if len(members) == 0 {
		return fmt.Errorf("%w: a consumer group needs members", ErrInvalidOption)
	}
	for _, m := range members {
		if err := validStreamName(m); err != nil {
			return fmt.Errorf("consumer group member: %w", err)
		}
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("nats: stream %s: %w", stream, err)
	}
	n, err := streamPartitions(st.CachedInfo().Config)
	if err != nil {
		return err
	}
	if _, err := pcgroups.CreateStatic(ctx, js, stream, group, uint(n), nil, members, nil); err != nil {
		return fmt.Errorf("%w: create %s on %s: %w", ErrConsumerGroup, group, stream, err)
	}
	return nil
}

// streamPartitions reads the partition count from the stream's subject
// transform, whose destination must begin with a partition(n, ...) token.
func streamPartitions(cfg jetstream.StreamConfig) (int, error) {
	if cfg.SubjectTransform == nil {
		return 0, fmt.Errorf("%w: stream %s has no subject transform putting a partition number first (see PartitionTransform)", ErrConsumerGroup, cfg.Name)
	}
	dest := strings.ToLower(strings.ReplaceAll(cfg.SubjectTransform.Destination, " ", ""))
	const fn = "{{partition("
	if !strings.HasPrefix(dest, fn) {
		return 0, fmt.Errorf("%w: stream %s's subject transform %q does not begin with a partition token (see PartitionTransform)", ErrConsumerGroup, cfg.Name, cfg.SubjectTransform.Destination)
	}
	rest := dest[len(fn):]
	end := strings.IndexAny(rest, ",)")
	n, err := strconv.Atoi(rest[:max(end, 0)])
	if end < 0 || err != nil || n < 1 {
		return 0, fmt.Errorf("%w: stream %s's subject transform %q: no partition count", ErrConsumerGroup, cfg.Name, cfg.SubjectTransform.Destination)
	}
	return n, nil
}

// groupSpec is the static group a Source is a member of.
type groupSpec struct {
	name, member string
	config       pcgroups.StaticConsumerGroupConfig
	topic        string  // engine partitions' Topic: "<stream>/<group>"
	parts        []int32 // the member's partitions, sorted
}

// joinGroup checks the group and the member and returns the member's
// consumer, created or updated to the group's filters.
func joinGroup(ctx context.Context, js jetstream.JetStream, stream string, o *sourceOptions) (jetstream.Consumer, *groupSpec, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		if noJetStream(err) {
			return nil, nil, fmt.Errorf("%w (%v)", ErrCoreNATS, err)
		}
		return nil, nil, fmt.Errorf("nats: stream %s: %w", stream, err)
	}
	n, err := streamPartitions(st.CachedInfo().Config)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := pcgroups.GetStaticConsumerGroupConfig(ctx, js, stream, o.group)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: group %s on stream %s: %w", ErrConsumerGroup, o.group, stream, err)
	}
	if int(cfg.MaxMembers) != n {
		return nil, nil, fmt.Errorf("%w: group %s has %d partitions, stream %s's transform makes %d", ErrConsumerGroup, o.group, cfg.MaxMembers, stream, n)
	}
	if len(cfg.Filters) > 0 {
		return nil, nil, fmt.Errorf("%w: group %s has filters %q; ringfence consumes every subject of a partition", ErrConsumerGroup, o.group, cfg.Filters)
	}
	if !cfg.IsInMembership(o.member) {
		return nil, nil, fmt.Errorf("%w: %q is not a member of group %s on stream %s", ErrConsumerGroup, o.member, o.group, stream)
	}
	filters := pcgroups.GeneratePartitionFilters(cfg.Members, cfg.MaxMembers, cfg.MemberMappings, o.member, ">")
	if len(filters) == 0 {
		return nil, nil, fmt.Errorf("%w: member %q of group %s owns no partition (more members than partitions)", ErrConsumerGroup, o.member, o.group)
	}
	g := &groupSpec{name: o.group, member: o.member, config: *cfg, topic: stream + "/" + o.group}
	for _, f := range filters {
		p, _, ok := strings.Cut(f, ".")
		id, err := strconv.Atoi(p)
		if !ok || err != nil {
			return nil, nil, fmt.Errorf("%w: pcgroups filter %q", ErrConsumerGroup, f)
		}
		g.parts = append(g.parts, int32(id))
	}
	slices.Sort(g.parts)

	cc := jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxDeliver: -1}
	if o.groupConfig != nil {
		cc = *o.groupConfig
		if cc.AckWait == 0 {
			cc.AckWait = 5 * time.Second
		}
	}
	cc.Name, cc.Durable = o.group+"-"+o.member, o.group+"-"+o.member
	cc.FilterSubject, cc.FilterSubjects = "", filters
	cc.PriorityGroups = []string{groupPriority}
	cc.PriorityPolicy = jetstream.PriorityPolicyPinned
	cc.PinnedTTL = PinnedTTL(cc.AckWait)
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, cc)
	if err != nil {
		return nil, nil, fmt.Errorf("nats: member consumer %s/%s: %w", stream, cc.Durable, err)
	}
	return cons, g, nil
}

// split takes the partition token off a subject of the group's stream.
func (g *groupSpec) split(subject string) (consumer.Partition, string, bool) {
	tok, rest, ok := strings.Cut(subject, ".")
	id, ok2 := digits(tok)
	if !ok || !ok2 || id > 1<<31-1 {
		return consumer.Partition{}, "", false
	}
	return consumer.Partition{Topic: g.topic, ID: int32(id)}, rest, true
}

// watchGroup ends Run (through l) when the group's configuration is
// deleted or changed: the member's partitions are then someone else's.
func (s *Source) watchGroup(ctx context.Context, l *liveness) error {
	kv, err := s.js.KeyValue(ctx, groupBucket)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrConsumerGroup, groupBucket, err)
	}
	w, err := kv.Watch(ctx, s.stream+"."+s.group.name, jetstream.UpdatesOnly())
	if err != nil {
		return fmt.Errorf("%w: watch %s: %w", ErrConsumerGroup, s.group.name, err)
	}
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					continue
				}
				if e.Operation() != jetstream.KeyValuePut {
					l.die(fmt.Errorf("%w: group %s on %s was deleted", ErrConsumerGroup, s.group.name, s.stream))
					return
				}
				var cfg pcgroups.StaticConsumerGroupConfig
				if err := json.Unmarshal(e.Value(), &cfg); err != nil || !reflect.DeepEqual(cfg, s.group.config) {
					l.die(fmt.Errorf("%w: group %s on %s changed; restart its members to take the new membership", ErrConsumerGroup, s.group.name, s.stream))
					return
				}
			}
		}
	}()
	return nil
}

// claim runs on the consume goroutine for each message of a pinned
// consumer and reports whether the message is this process's to deliver.
// The first message with a pin the Source has not seen makes it the owner
// of its partitions (Assigned); a message stamped with a pin it lost, or
// with none, is handed back (Nak) for the pinned process.
func (s *Source) claim(d consumer.Dispatcher, msg jetstream.Msg) bool {
	pid := msg.Headers().Get(pinHeader)
	if pid == "" || slices.Contains(s.lostPins[:], pid) {
		_ = msg.Nak()
		return false
	}
	if pid == s.pin {
		return true
	}
	if s.owning { // a new pin without a mismatch first: someone may have held it between
		s.disown(d, "pin changed")
	}
	s.pin = pid
	s.owning = true
	s.owned.Store(true)
	s.pinChanges.Add(1)
	s.log.Info("ringfence nats: pinned; owning partitions", "partitions", len(s.parts))
	for _, p := range s.parts {
		d.Assigned(p)
	}
	return true
}

// lostPin runs on the consume goroutine when the server says the Source's
// pin is no longer current: another process owns its partitions now.
func (s *Source) lostPin(d consumer.Dispatcher) {
	if s.pin == "" {
		return
	}
	s.lostPins[s.lostNext%len(s.lostPins)] = s.pin
	s.lostNext++
	s.pin = ""
	if s.owning {
		s.disown(d, "pin lost")
	}
}

// disown revokes every partition from the engine and hands the messages
// it still held back to the server (Nak, in stream order), which
// redelivers them to the pinned process. Only the consume goroutine, or
// Run once consuming stopped, calls it.
func (s *Source) disown(d consumer.Dispatcher, why string) {
	s.log.Info("ringfence nats: no longer pinned; revoking partitions", "why", why, "partitions", len(s.parts))
	s.owning = false
	s.owned.Store(false)
	for _, p := range s.parts {
		d.Revoked(p)
	}
	// The server redelivers in the order of the naks: stream order, the
	// messages the client buffered included.
	held := s.appendHeld(s.unfed, true)
	s.unfed = nil
	slices.SortFunc(held, func(a, b heldMsg) int { return cmpSeq(a.seq, b.seq) })
	for _, h := range held {
		_ = h.m.Nak() // a lost nak waits for AckWait
	}
}

func cmpSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// stepDown ends a pinned Source's ownership when Run ends: it revokes its
// partitions, hands back what the engine held, and unpins itself so a
// standby takes over at its next pull instead of after PinnedTTL.
func (s *Source) stepDown(d consumer.Dispatcher) {
	if !s.owning {
		for _, h := range s.unfed { // delivered under a pin already lost
			_ = h.m.Nak()
		}
		s.unfed = nil
		return
	}
	s.disown(d, "stopping")
	if s.js.Conn().Status() != nats.CONNECTED {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, s.stream)
	if err == nil {
		err = st.UnpinConsumer(ctx, s.durable, s.pinGroup)
	}
	if err != nil {
		s.log.Warn("ringfence nats: unpin on stop failed; a standby takes over after the pin's TTL", "err", err)
	}
}

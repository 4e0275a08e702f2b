package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// ErrUnknownTopic is wrapped by the error Run returns when the source topic
// stayed unknown to the cluster for the whole UnknownTopicTimeout (it was
// never created, or it was deleted). The error also wraps kafka-go's
// UnknownTopicOrPartition.
var ErrUnknownTopic = errors.New("kafka: source topic does not exist")

// terminalCodes are the broker answers that no retry can change: the
// credentials, the ACLs or the configuration must be fixed first. Everything
// else (a broker down or restarting, a coordinator moving, a rebalance, a
// leader election, a timeout) is retried.
var terminalCodes = []kafkago.Error{
	kafkago.SASLAuthenticationFailed,
	kafkago.UnsupportedSASLMechanism,
	kafkago.IllegalSASLState,
	kafkago.TopicAuthorizationFailed,
	kafkago.GroupAuthorizationFailed,
	kafkago.ClusterAuthorizationFailed,
	kafkago.InvalidGroupId,
	kafkago.InvalidSessionTimeout,
	kafkago.InvalidTopic,
}

// terminal reports whether err, from joining the group, fetching or
// committing, can never succeed on retry. UnknownTopicOrPartition is not
// terminal by itself: the topic may be created late (see topicWatch).
func terminal(err error) bool {
	var ke kafkago.Error
	return errors.As(err, &ke) && slices.Contains(terminalCodes, ke)
}

// unknownTopic reports whether err says the topic (or one of its
// partitions) does not exist.
func unknownTopic(err error) bool {
	return errors.Is(err, kafkago.UnknownTopicOrPartition)
}

// topicWatch decides when an unknown topic is given up on: once the topic
// has been reported unknown, with no sighting of it in between, for at
// least grace. It takes the time as an argument so tests need no clock. It
// is safe for concurrent use.
type topicWatch struct {
	grace time.Duration

	mu    sync.Mutex
	since time.Time // first "unknown" of the current streak; zero if the topic was seen since
}

// seen records that the topic exists.
func (w *topicWatch) seen() {
	w.mu.Lock()
	w.since = time.Time{}
	w.mu.Unlock()
}

// unknown records, at now, that the topic was reported unknown. It returns
// how long the topic has been unknown and whether that reached grace.
func (w *topicWatch) unknown(now time.Time) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.since.IsZero() {
		w.since = now
	}
	d := now.Sub(w.since)
	return d, d >= w.grace
}

// probeEvery is how often a member without partitions checks the topic:
// often enough to give up within the grace, at most every 5s.
func (w *topicWatch) probeEvery() time.Duration {
	return min(5*time.Second, max(w.grace/4, 10*time.Millisecond))
}

// fatal records the error that ends Run; the first one wins. Safe for
// concurrent use.
type fatal struct {
	mu     sync.Mutex
	err    error
	cancel context.CancelFunc // ends Run's context; set before Run starts any goroutine
}

func (f *fatal) set(err error) {
	f.mu.Lock()
	first := f.err == nil
	if first {
		f.err = err
	}
	f.mu.Unlock()
	if first {
		f.cancel()
	}
}

func (f *fatal) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// failed reports err to Run if it is terminal, or if it says the topic is
// unknown and has been for the whole grace. It returns true then; the
// caller should stop. Otherwise the caller retries.
func (s *Source) failed(err error) bool {
	switch {
	case terminal(err):
		s.fatal.set(fmt.Errorf("kafka: topic %q, group %q: %w", s.topic, s.group, err))
		return true
	case unknownTopic(err):
		if d, over := s.watch.unknown(time.Now()); over {
			s.fatal.set(fmt.Errorf("%w: topic %q unknown to the cluster for %v (UnknownTopicTimeout %v): %w",
				ErrUnknownTopic, s.topic, d.Round(time.Millisecond), s.watch.grace, err))
			return true
		}
	}
	return false
}

// watchTopic runs in a generation that gave this member no partition. It
// checks the topic every probeEvery: if it stays unknown past the grace,
// Run ends with ErrUnknownTopic. If the topic exists but the group leaves
// some of its partitions unassigned (it was created after the leader
// looked), returning ends the generation, so that the group rebalances and
// assigns them.
func (s *Source) watchTopic(ctx context.Context, gen *kafkago.Generation) {
	t := time.NewTicker(s.watch.probeEvery())
	defer t.Stop()
	for {
		if s.topicNeedsRebalance(ctx, gen) {
			s.log.Info("kafka: topic has unassigned partitions; rejoining the group", "generation", gen.ID)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// topicNeedsRebalance probes the topic once; see watchTopic.
func (s *Source) topicNeedsRebalance(ctx context.Context, gen *kafkago.Generation) bool {
	pctx, cancel := context.WithTimeout(ctx, max(s.watch.probeEvery(), 2*time.Second))
	defer cancel()
	md, err := s.client.Metadata(pctx, &kafkago.MetadataRequest{Topics: []string{s.topic}})
	if err == nil && len(md.Topics) == 0 {
		err = kafkago.UnknownTopicOrPartition
	}
	if err == nil {
		err = md.Topics[0].Error
	}
	switch {
	case err == nil:
	case ctx.Err() != nil, s.failed(err):
		return false
	case unknownTopic(err):
		s.log.Warn("kafka: topic does not exist; waiting for it", "timeout", s.watch.grace)
		return false
	default:
		s.log.Warn("kafka: topic metadata failed; retrying", "err", err)
		return false
	}
	s.watch.seen()
	parts := len(md.Topics[0].Partitions)
	resp, err := s.client.DescribeGroups(pctx, &kafkago.DescribeGroupsRequest{GroupIDs: []string{s.group}})
	if err == nil && len(resp.Groups) == 1 {
		err = resp.Groups[0].Error
	}
	if err != nil || len(resp.Groups) != 1 || resp.Groups[0].GroupState != "Stable" {
		// Without settled assignments we cannot tell a late topic from a
		// member that is simply not needed; stay, and look again.
		s.log.Debug("kafka: describe group", "err", err)
		return false
	}
	assigned := 0
	for _, m := range resp.Groups[0].Members {
		for _, at := range m.MemberAssignments.Topics {
			if at.Topic == s.topic {
				assigned += len(at.Partitions)
			}
		}
	}
	return assigned < parts
}

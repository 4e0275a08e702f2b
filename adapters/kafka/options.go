package kafka

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrInvalidOption is wrapped by every error that an option or a
// constructor returns for a bad setting.
var ErrInvalidOption = errors.New("kafka: invalid option")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// SourceOption configures a Source. Each option checks its own argument.
type SourceOption func(*sourceConfig) error

type sourceConfig struct {
	dialer            *kafkago.Dialer
	commitInterval    time.Duration
	heartbeatInterval time.Duration
	sessionTimeout    time.Duration
	rebalanceTimeout  time.Duration
	joinBackoff       time.Duration
	maxWait           time.Duration
	maxBytes          int
	startOffset       int64
	topicGrace        time.Duration
	logger            *slog.Logger
	// dialerSet is set by WithDialer, which a GroupSource refuses.
	dialerSet bool
	// clientOpts are WithClientOptions', which a Source refuses.
	clientOpts []kgo.Opt
}

func defaultSourceConfig() sourceConfig {
	return sourceConfig{
		dialer:            kafkago.DefaultDialer,
		commitInterval:    time.Second,
		heartbeatInterval: 3 * time.Second,
		sessionTimeout:    30 * time.Second,
		rebalanceTimeout:  30 * time.Second,
		joinBackoff:       time.Second,
		maxWait:           500 * time.Millisecond,
		maxBytes:          1 << 20,
		startOffset:       kafkago.FirstOffset,
		topicGrace:        time.Minute,
		logger:            slog.Default(),
	}
}

// WithDialer sets the dialer for every connection (TLS, SASL, timeouts).
// Default: kafka-go's DefaultDialer.
func WithDialer(d *kafkago.Dialer) SourceOption {
	return func(c *sourceConfig) error {
		if d == nil {
			return invalid("nil dialer")
		}
		c.dialer, c.dialerSet = d, true
		return nil
	}
}

// WithCommitInterval sets how often settled offsets are committed. Commits
// also happen on revocation and on shutdown. Default: 1s.
func WithCommitInterval(d time.Duration) SourceOption {
	return func(c *sourceConfig) error {
		if d <= 0 {
			return invalid("commit interval %v is not positive", d)
		}
		c.commitInterval = d
		return nil
	}
}

// WithHeartbeatInterval sets how often the group coordinator is told this
// member is alive; a rebalance is noticed at the next heartbeat.
// Default: 3s.
func WithHeartbeatInterval(d time.Duration) SourceOption {
	return func(c *sourceConfig) error {
		if d <= 0 {
			return invalid("heartbeat interval %v is not positive", d)
		}
		c.heartbeatInterval = d
		return nil
	}
}

// WithSessionTimeout sets how long the coordinator waits for a heartbeat
// before it evicts a silent member. It must lie within the broker's
// group.min/max.session.timeout.ms. Default: 30s.
func WithSessionTimeout(d time.Duration) SourceOption {
	return func(c *sourceConfig) error {
		if d <= 0 {
			return invalid("session timeout %v is not positive", d)
		}
		c.sessionTimeout = d
		return nil
	}
}

// WithRebalanceTimeout sets how long the coordinator waits for members to
// rejoin during a rebalance. Default: 30s.
func WithRebalanceTimeout(d time.Duration) SourceOption {
	return func(c *sourceConfig) error {
		if d <= 0 {
			return invalid("rebalance timeout %v is not positive", d)
		}
		c.rebalanceTimeout = d
		return nil
	}
}

// WithJoinBackoff sets the pause before joining the group again after a
// failed join (e.g. while the broker restarts). Default: 1s.
func WithJoinBackoff(d time.Duration) SourceOption {
	return func(c *sourceConfig) error {
		if d <= 0 {
			return invalid("join backoff %v is not positive", d)
		}
		c.joinBackoff = d
		return nil
	}
}

// WithMaxWait sets how long the broker may hold a fetch that has no data
// yet. It also bounds how long Pause or shutdown wait for an idle fetch.
// Default: 500ms.
func WithMaxWait(d time.Duration) SourceOption {
	return func(c *sourceConfig) error {
		if d <= 0 {
			return invalid("max wait %v is not positive", d)
		}
		c.maxWait = d
		return nil
	}
}

// WithMaxBytes sets the most bytes one fetch of one partition returns:
// what a partition's fetcher holds ahead of the engine, and the size of the
// buffer each fetch response is read into. Default: 1 MiB.
func WithMaxBytes(n int) SourceOption {
	return func(c *sourceConfig) error {
		if n < 1 {
			return invalid("max bytes %d is not positive", n)
		}
		c.maxBytes = n
		return nil
	}
}

// WithStartOffset sets where a partition with no committed offset starts:
// kafka-go's FirstOffset or LastOffset. Default: FirstOffset.
func WithStartOffset(offset int64) SourceOption {
	return func(c *sourceConfig) error {
		if offset != kafkago.FirstOffset && offset != kafkago.LastOffset {
			return invalid("start offset %d is neither FirstOffset nor LastOffset", offset)
		}
		c.startOffset = offset
		return nil
	}
}

// WithUnknownTopicTimeout sets how long the source topic may stay unknown
// to the cluster (never created, or deleted) before Run gives up and
// returns an error wrapping ErrUnknownTopic. The clock starts at the first
// UnknownTopicOrPartition answer and restarts whenever the topic is seen,
// so a topic that is auto-created, or created by a deployment a little
// after the consumer starts, is waited for and then consumed. While it is
// unknown the source checks it every quarter of d (at most every 5s).
// Default: 1 minute.
func WithUnknownTopicTimeout(d time.Duration) SourceOption {
	return func(c *sourceConfig) error {
		if d <= 0 {
			return invalid("unknown topic timeout %v is not positive", d)
		}
		c.topicGrace = d
		return nil
	}
}

// WithLogger sets the logger for reconnects, failed commits and
// rebalances. Default: slog.Default().
func WithLogger(l *slog.Logger) SourceOption {
	return func(c *sourceConfig) error {
		if l == nil {
			return invalid("nil logger")
		}
		c.logger = l
		return nil
	}
}

// WithClientOptions adds options to the kgo clients of a GroupSource (the
// group's, and each partition fetcher's): connections (kgo.Dialer,
// kgo.DialTLSConfig, kgo.SASL), kgo.ClientID, kgo.InstanceID and the like.
// Options that would change how the group is consumed (balancers,
// autocommit, the callbacks) are set by the source after these and win.
// A Source refuses this option. Default: none.
func WithClientOptions(opts ...kgo.Opt) SourceOption {
	return func(c *sourceConfig) error {
		for _, o := range opts {
			if o == nil {
				return invalid("nil kgo option")
			}
		}
		c.clientOpts = append(c.clientOpts, opts...)
		return nil
	}
}

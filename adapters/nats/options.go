package nats

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrInvalidOption: an option was given an unusable value.
var ErrInvalidOption = errors.New("nats: invalid option")

// ErrCoreNATS: the server has no JetStream. Core NATS subscriptions have no
// acknowledgement and no redelivery, so a parked or failed message could not
// be kept or retried: ringfence refuses them rather than lose messages.
var ErrCoreNATS = errors.New("nats: JetStream is not enabled: core NATS subscriptions cannot be acknowledged or redelivered, so ringfence cannot park or dead-letter without losing messages; consume from a JetStream stream instead")

// ErrConsumerConfig: the JetStream consumer cannot be used by a Source.
var ErrConsumerConfig = errors.New("nats: unusable consumer configuration")

// SourceOption configures a Source. Options validate themselves; an invalid
// value makes NewSource fail with an error wrapping ErrInvalidOption.
type SourceOption func(*sourceOptions) error

type sourceOptions struct {
	extendEvery time.Duration
	pullMax     int
	doubleAck   bool
	logger      *slog.Logger
	liveness    time.Duration

	group, member string                    // WithConsumerGroup
	groupConfig   *jetstream.ConsumerConfig // WithGroupConsumerConfig
	pin           bool                      // WithPinnedClient
}

// WithLivenessCheck sets how often Run asks the server whether the durable
// consumer still exists (one consumer info request). A consumer deleted
// while a pull request waits on the server ends Run at once; the check
// finds one deleted while none waited (the Source paused, the client
// reconnecting), so Run returns within d plus the request's timeout (d,
// at least 1s) of such a deletion. Default: 5s.
func WithLivenessCheck(d time.Duration) SourceOption {
	return func(o *sourceOptions) error {
		if d <= 0 {
			return fmt.Errorf("%w: liveness check interval %v is not positive", ErrInvalidOption, d)
		}
		o.liveness = d
		return nil
	}
}

// WithExtendEvery sets how often the Source tells the server that messages
// the engine still holds are in progress (InProgress), which restarts their
// AckWait. Default: a third of the consumer's AckWait.
func WithExtendEvery(d time.Duration) SourceOption {
	return func(o *sourceOptions) error {
		if d <= 0 {
			return fmt.Errorf("%w: extend interval %v <= 0", ErrInvalidOption, d)
		}
		o.extendEvery = d
		return nil
	}
}

// WithPullMaxMessages sets how many messages the client buffers ahead of the
// engine (jetstream.PullMaxMessages). Default: 500, nats.go's default.
func WithPullMaxMessages(n int) SourceOption {
	return func(o *sourceOptions) error {
		if n < 1 {
			return fmt.Errorf("%w: pull max messages %d < 1", ErrInvalidOption, n)
		}
		o.pullMax = n
		return nil
	}
}

// WithDoubleAck makes Settle wait for the server to confirm each ack
// (jetstream.Msg.DoubleAck). Default: off; a plain Ack is sent and an ack
// lost in transit only means the message is delivered again (at-least-once),
// at a fraction of the cost of a round trip per message.
func WithDoubleAck() SourceOption {
	return func(o *sourceOptions) error {
		o.doubleAck = true
		return nil
	}
}

// WithLogger sets the logger. Default: slog.Default().
func WithLogger(l *slog.Logger) SourceOption {
	return func(o *sourceOptions) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		o.logger = l
		return nil
	}
}

// SpillOption configures a SpillLog. Options validate themselves; an
// invalid value makes NewSpillLog fail with an error wrapping
// ErrInvalidOption.
type SpillOption func(*spillOptions) error

type spillOptions struct {
	stream, prefix string
	bucket         string
	timeout        time.Duration
	logger         *slog.Logger
}

// WithSpillStream names the spill stream and the subject prefix of its
// per-tenant subjects ("<prefix>.<token>"). Default: stream
// "RINGFENCE_SPILL_<stream>_<durable>", prefix
// "ringfence.spill.<stream>.<durable>". The stream is created (file storage)
// if missing.
func WithSpillStream(name, prefix string) SpillOption {
	return func(o *spillOptions) error {
		if err := validStreamName(name); err != nil {
			return err
		}
		if err := validPrefix(prefix); err != nil {
			return err
		}
		o.stream, o.prefix = name, prefix
		return nil
	}
}

// WithSpillBodyBucket names the JetStream object store bucket that holds
// spilled messages too large for one record (see SpillLog); it is created
// (file storage) on first need and recorded in the stream's metadata
// (MetaSpillBodies), which wins for an existing stream. Default: the spill
// stream's name with "_BODIES".
func WithSpillBodyBucket(name string) SpillOption {
	return func(o *spillOptions) error {
		if err := validBucketName(name); err != nil {
			return err
		}
		o.bucket = name
		return nil
	}
}

// WithSpillTimeout bounds each SpillLog call's wait for the server (an
// Append's acknowledgements, a Read, a Commit, a Pending); the engine
// retries a call that failed. Default: 10s.
func WithSpillTimeout(d time.Duration) SpillOption {
	return func(o *spillOptions) error {
		if d <= 0 {
			return fmt.Errorf("%w: spill timeout %v is not positive", ErrInvalidOption, d)
		}
		o.timeout = d
		return nil
	}
}

// WithSpillLogger sets the SpillLog's logger. Default: slog.Default().
func WithSpillLogger(l *slog.Logger) SpillOption {
	return func(o *spillOptions) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		o.logger = l
		return nil
	}
}

// DLQOption configures a DLQ.
type DLQOption func(*dlqOptions) error

type dlqOptions struct {
	stream    string
	prefix    string
	prefixSet bool
	bucket    string
}

func buildDLQOptions(opts []DLQOption) (dlqOptions, error) {
	o := dlqOptions{stream: DefaultDLQStream, prefix: DefaultDLQPrefix}
	for _, opt := range opts {
		if opt == nil {
			return o, fmt.Errorf("%w: nil DLQ option", ErrInvalidOption)
		}
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// bucketFor is the body bucket a new DLQ stream gets.
func (o dlqOptions) bucketFor() string {
	if o.bucket != "" {
		return o.bucket
	}
	return defaultBucket(o.stream)
}

// Default DLQ names.
const (
	DefaultDLQStream = "RINGFENCE_DLQ"
	DefaultDLQPrefix = "ringfence.dlq"
)

// WithDLQStream sets the DLQ stream name. Default: DefaultDLQStream.
func WithDLQStream(name string) DLQOption {
	return func(o *dlqOptions) error {
		if err := validStreamName(name); err != nil {
			return err
		}
		o.stream = name
		return nil
	}
}

// WithDLQPrefix sets the DLQ subject prefix; each tenant's records go to
// dlq.NATSSubject(prefix, tenant). Default: the prefix recorded in the
// stream's metadata (MetaPrefix), else DefaultDLQPrefix for NewDLQ and the
// stream's only subject "<prefix>.>" for OpenDLQ.
func WithDLQPrefix(prefix string) DLQOption {
	return func(o *dlqOptions) error {
		if err := validPrefix(prefix); err != nil {
			return err
		}
		o.prefix, o.prefixSet = prefix, true
		return nil
	}
}

// WithDLQBodyBucket names the JetStream object store bucket that holds the
// bodies of dead letters too large for one message; it is created (file
// storage) on first need and recorded in the stream's metadata
// (MetaBodies), which wins for an existing stream. Default: the stream's
// name with "_BODIES" ("RINGFENCE_DLQ_BODIES").
func WithDLQBodyBucket(name string) DLQOption {
	return func(o *dlqOptions) error {
		if err := validBucketName(name); err != nil {
			return err
		}
		o.bucket = name
		return nil
	}
}

func validBucketName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty bucket name", ErrInvalidOption)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: bucket name %q: character %q not in [A-Za-z0-9_-]", ErrInvalidOption, name, c)
		}
	}
	return nil
}

func validStreamName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty stream name", ErrInvalidOption)
	}
	for _, c := range name {
		switch c {
		case '.', '*', '>', '/', '\\', ' ', '\t', '\r', '\n':
			return fmt.Errorf("%w: stream name %q contains %q", ErrInvalidOption, name, c)
		}
	}
	return nil
}

func validPrefix(prefix string) error {
	if prefix == "" {
		return fmt.Errorf("%w: empty subject prefix", ErrInvalidOption)
	}
	tok := 0
	for i := 0; i < len(prefix); i++ {
		switch c := prefix[i]; c {
		case '.':
			if tok == 0 {
				return fmt.Errorf("%w: subject prefix %q has an empty token", ErrInvalidOption, prefix)
			}
			tok = 0
		case '*', '>', ' ', '\t', '\r', '\n':
			return fmt.Errorf("%w: subject prefix %q contains %q", ErrInvalidOption, prefix, c)
		default:
			tok++
		}
	}
	if tok == 0 {
		return fmt.Errorf("%w: subject prefix %q ends with '.'", ErrInvalidOption, prefix)
	}
	return nil
}

package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// MetaFleet is the NATS KV bucket metadata key that marks a bucket as a
// ringfence fleet table; its value is the table's kind ("status" or
// "control").
const MetaFleet = "ringfence-fleet"

// DefaultTTL is how long a process's status lives without a new heartbeat
// (AgentConfig.TTL, NATSOptions.TTL).
const DefaultTTL = 10 * time.Second

// watchBuffer bounds the updates a watch holds for a slow reader.
const watchBuffer = 256

// NATSOptions configure NewNATSStore.
type NATSOptions struct {
	// Create makes the buckets when they do not exist (the agent's way);
	// without it a missing bucket is ErrNoTable (the CLI's way for status).
	Create bool
	// TTL is the status bucket's MaxAge when it is created: a status not
	// refreshed within it is removed by the server. Default DefaultTTL;
	// keep it at least the agents' AgentConfig.TTL (readers also drop a
	// status past its own TTL).
	TTL time.Duration
}

// NATSBucket names a group's bucket of kind: "ringfence-status-<group>" or
// "ringfence-control-<group>", the group encoded as a dlq token (legal in a
// bucket name).
func NATSBucket(group string, kind Kind) string {
	return "ringfence-" + kind.String() + "-" + Key(group)
}

type natsStore struct {
	status, control jetstream.KeyValue
}

// NewNATSStore opens (with opts.Create, makes) the group's two KV buckets.
// A bucket without the MetaFleet marker is refused with ErrNotFleet. The
// store does not own js's connection: Close leaves it open.
func NewNATSStore(ctx context.Context, js jetstream.JetStream, group string, opts NATSOptions) (Store, error) {
	if group == "" {
		return nil, errors.New("fleet: a store needs a group")
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultTTL
	}
	s := &natsStore{}
	var err error
	if s.status, err = openBucket(ctx, js, group, KindStatus, opts); err != nil {
		return nil, err
	}
	if s.control, err = openBucket(ctx, js, group, KindControl, opts); err != nil {
		return nil, err
	}
	return s, nil
}

func openBucket(ctx context.Context, js jetstream.JetStream, group string, kind Kind, opts NATSOptions) (jetstream.KeyValue, error) {
	name := NATSBucket(group, kind)
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		if !opts.Create {
			return nil, fmt.Errorf("%w: no KV bucket %s (no process of group %q has run an agent)", ErrNoTable, name, group)
		}
		cfg := jetstream.KeyValueConfig{
			Bucket:      name,
			Description: "ringfence fleet " + kind.String() + " of group " + group,
			History:     1,
			Metadata:    map[string]string{MetaFleet: kind.String()},
		}
		if kind == KindStatus {
			cfg.TTL = opts.TTL
		}
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, name) // made by another process meanwhile
		}
	}
	if err != nil {
		return nil, fmt.Errorf("fleet: KV bucket %s: %w", name, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet: KV bucket %s: %w", name, err)
	}
	if got := st.Metadata()[MetaFleet]; got != kind.String() {
		return nil, fmt.Errorf("%w: KV bucket %s has %s metadata %q, want %q; refusing to touch it", ErrNotFleet, name, MetaFleet, got, kind.String())
	}
	return kv, nil
}

func (s *natsStore) kv(kind Kind) jetstream.KeyValue {
	if kind == KindStatus {
		return s.status
	}
	return s.control
}

func (s *natsStore) Put(ctx context.Context, kind Kind, key string, value []byte) error {
	if _, err := s.kv(kind).Put(ctx, key, value); err != nil {
		return fmt.Errorf("fleet: put %s %s: %w", kind, key, err)
	}
	return nil
}

func (s *natsStore) Delete(ctx context.Context, kind Kind, key string) error {
	if err := s.kv(kind).Delete(ctx, key); err != nil {
		return fmt.Errorf("fleet: delete %s %s: %w", kind, key, err)
	}
	return nil
}

func (s *natsStore) Watch(ctx context.Context, kind Kind) (<-chan Update, error) {
	w, err := s.kv(kind).WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet: watch %s: %w", kind, err)
	}
	out := make(chan Update, watchBuffer)
	go func() {
		defer close(out)
		defer w.Stop()
		send := func(u Update) bool { return sendUpdate(ctx, out, u) }
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					if ctx.Err() == nil {
						send(Update{Err: fmt.Errorf("fleet: the %s watch stopped", kind)})
					}
					return
				}
				var u Update
				switch {
				case e == nil:
					u = Update{Loaded: true}
				case e.Operation() == jetstream.KeyValuePut:
					u = Update{Key: e.Key(), Value: nonNil(e.Value())}
				default:
					u = Update{Key: e.Key()}
				}
				if !send(u) {
					return
				}
			}
		}
	}()
	return out, nil
}

func (s *natsStore) Close() error { return nil }

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

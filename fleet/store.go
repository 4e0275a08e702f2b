package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ringfence/ringfence/dlq"
)

// Kind says which of a group's two tables a record belongs to.
type Kind uint8

// The two tables.
const (
	// KindStatus: processes' heartbeats, keyed by process token.
	KindStatus Kind = iota + 1
	// KindControl: tenants' controls, keyed by tenant token.
	KindControl
)

func (k Kind) String() string {
	switch k {
	case KindStatus:
		return "status"
	case KindControl:
		return "control"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// ErrNotFleet: a topic or bucket exists under a fleet table's name but is
// not one (no ringfence marker, or records without it). Nothing is read
// from or written to it.
var ErrNotFleet = errors.New("fleet: not a ringfence fleet table")

// ErrNoTable: the table does not exist and the store was opened without
// creating it.
var ErrNoTable = errors.New("fleet: no such table")

// Update is one change of a table, as a Watch sees it.
type Update struct {
	Key   string
	Value []byte // nil: the key was deleted
	// Loaded marks the end of the records present when the watch began
	// (Key and Value are then empty). It comes once.
	Loaded bool
	// Err ends the watch: the channel is closed after it.
	Err error
}

// Store holds a group's two tables on a broker: a Kafka compacted topic or
// a NATS KV bucket each. Stores are safe for concurrent use.
type Store interface {
	// Put writes key's latest value.
	Put(ctx context.Context, kind Kind, key string, value []byte) error
	// Delete removes key (a Kafka tombstone, a NATS KV delete).
	Delete(ctx context.Context, kind Kind, key string) error
	// Watch sends every record of the table, then an Update with Loaded,
	// then every change, until ctx is done (the channel is then closed) or
	// an Update with Err.
	Watch(ctx context.Context, kind Kind) (<-chan Update, error)
	// Close releases the store's connections.
	Close() error
}

// Key is the record key of a tenant or a process: its dlq.TenantToken,
// legal as a Kafka key and a NATS KV key.
func Key(s string) string { return dlq.TenantToken(s) }

// PublishStatus writes a process's status.
func PublishStatus(ctx context.Context, st Store, s Status) error {
	b, err := EncodeStatus(s)
	if err != nil {
		return err
	}
	return st.Put(ctx, KindStatus, Key(s.Process), b)
}

// WriteControl writes a tenant's control record.
func WriteControl(ctx context.Context, st Store, r ControlRecord) error {
	b, err := EncodeControl(r)
	if err != nil {
		return err
	}
	return st.Put(ctx, KindControl, Key(r.Tenant), b)
}

// ReadStatuses returns the statuses of live processes (not Expired at now),
// keyed by process. Records that do not decode are skipped, each with one
// log line.
func ReadStatuses(ctx context.Context, st Store, now time.Time, log *slog.Logger) (map[string]Status, error) {
	raw, err := load(ctx, st, KindStatus)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Status, len(raw))
	for k, v := range raw {
		s, err := DecodeStatus(v)
		if err != nil {
			logger(log).Warn("fleet: skipping a status record that does not decode", "key", k, "err", err)
			continue
		}
		if !s.Expired(now) {
			out[s.Process] = s
		}
	}
	return out, nil
}

// ReadControls returns the control records, keyed by tenant (cleared ones
// included). Records that do not decode are skipped, each with one log line.
func ReadControls(ctx context.Context, st Store, log *slog.Logger) (map[string]ControlRecord, error) {
	raw, err := load(ctx, st, KindControl)
	if err != nil {
		return nil, err
	}
	out := make(map[string]ControlRecord, len(raw))
	for k, v := range raw {
		r, ok := decodeControlAt(k, v, log)
		if ok {
			out[r.Tenant] = r
		}
	}
	return out, nil
}

// decodeControlAt decodes a control record and checks that its key is its
// tenant's.
func decodeControlAt(key string, v []byte, log *slog.Logger) (ControlRecord, bool) {
	r, err := DecodeControl(v)
	if err == nil && Key(r.Tenant) != key {
		err = fmt.Errorf("%w: key %q is not the token of its tenant", ErrBadRecord, key)
	}
	if err != nil {
		logger(log).Warn("fleet: skipping a control record that does not decode", "key", key, "err", err)
		return ControlRecord{}, false
	}
	return r, true
}

// load reads a whole table once.
func load(ctx context.Context, st Store, kind Kind) (map[string][]byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := st.Watch(ctx, kind)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for u := range ch {
		switch {
		case u.Err != nil:
			return nil, u.Err
		case u.Loaded:
			return out, nil
		case u.Value == nil:
			delete(out, u.Key)
		default:
			out[u.Key] = u.Value
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fleet: reading the %s table: %w", kind, err)
	}
	return nil, fmt.Errorf("fleet: the %s table's watch ended early", kind)
}

func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}

// sendUpdate hands u to a watcher's channel, or gives up when ctx ends.
func sendUpdate(ctx context.Context, out chan<- Update, u Update) bool {
	select {
	case out <- u:
		return true
	case <-ctx.Done():
		return false
	}
}

package nats

// Moving an older ringfence's park stream into the spill stream.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// Headers of a park record, as the Source of an older ringfence wrote them
// (it spilled by itself, to a "park" stream).
const (
	hdrParkPrefix  = "ringfence-park-"
	hdrParkTenant  = "ringfence-park-tenant"
	hdrParkSubject = "ringfence-park-subject"
	hdrParkSeq     = "ringfence-park-seq"
	hdrParkTime    = "ringfence-park-time"
	hdrParkNats    = "ringfence-park-h-"
)

// migrateBatch is how many park records are moved per Append.
const migrateBatch = 256

// migrate moves every record of the park stream name (subjects
// "<prefix>.<token>") into the spill log, tenant by tenant and in order,
// purging each tenant's park subject once its records are appended, and
// deletes the park stream when it is empty. It runs before the engine
// reads the spill log, so moved records come before anything spilled
// later. A crash midway moves some records twice: the spill stream's
// duplicate window or the engine's re-feed drops the copies.
func (s *SpillLog) migrate(ctx context.Context, name, prefix string) error {
	park, err := s.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("nats: park stream %s: %w", name, err)
	}
	info, err := park.Info(ctx, jetstream.WithSubjectFilter(prefix+".*"))
	if err != nil {
		return fmt.Errorf("nats: park stream %s: %w", name, err)
	}
	moved := 0
	for subj, n := range info.State.Subjects {
		if n == 0 {
			continue
		}
		k, err := s.migrateSubject(ctx, park, prefix, subj)
		moved += k
		if err != nil {
			return err
		}
	}
	s.migrated.Add(uint64(moved))
	info, err = park.Info(ctx)
	if err != nil {
		return fmt.Errorf("nats: park stream %s: %w", name, err)
	}
	if info.State.Msgs == 0 {
		if err := s.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("nats: delete the emptied park stream %s: %w", name, err)
		}
		s.log.Info("ringfence nats: moved an older park stream into the spill stream and deleted it", "park_stream", name, "records", moved)
	} else {
		s.log.Warn("ringfence nats: park stream keeps messages not under its prefix; left in place", "park_stream", name, "prefix", prefix, "messages", info.State.Msgs)
	}
	return nil
}

// migrateSubject moves one tenant's park records.
func (s *SpillLog) migrateSubject(ctx context.Context, park jetstream.Stream, prefix, subj string) (int, error) {
	tok, ok := dlq.SplitNATSSubject(prefix, subj)
	if !ok {
		return 0, nil
	}
	tenant, exact, err := dlq.ParseTenantToken(tok)
	if err != nil {
		s.log.Warn("ringfence nats: park subject is not a tenant's; left in place", "subject", subj, "err", err)
		return 0, nil
	}
	moved := 0
	var next uint64
	for {
		var batch []*consumer.Message
		var last uint64
		for len(batch) < migrateBatch {
			raw, err := park.GetMsg(ctx, next, jetstream.WithGetMsgSubject(subj))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return moved, fmt.Errorf("nats: park stream %s: %w", subj, err)
			}
			if !exact {
				tenant = raw.Header.Get(hdrParkTenant) // NATS trims it; only hashed keys depend on it
			}
			batch = append(batch, s.fromPark(raw))
			last, next = raw.Sequence, raw.Sequence+1
		}
		if len(batch) == 0 {
			return moved, nil
		}
		if err := s.Append(ctx, consumer.SpillLane{Tenant: tenant, Partition: s.home}, batch); err != nil {
			return moved, fmt.Errorf("nats: move park records of %s: %w", subj, err)
		}
		if err := park.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeSequence(last+1)); err != nil {
			return moved, fmt.Errorf("nats: purge moved park records of %s: %w", subj, err)
		}
		moved += len(batch)
	}
}

// fromPark rebuilds the original message of a park record.
func (s *SpillLog) fromPark(raw *jetstream.RawStreamMsg) *consumer.Message {
	m := &consumer.Message{
		Value:     raw.Data,
		Topic:     raw.Header.Get(hdrParkSubject),
		Stream:    strings.SplitN(s.home.Topic, "/", 2)[0],
		Partition: s.home,
		Time:      raw.Time,
	}
	m.Offset, _ = strconv.ParseInt(raw.Header.Get(hdrParkSeq), 10, 64)
	if t, err := time.Parse(time.RFC3339Nano, raw.Header.Get(hdrParkTime)); err == nil {
		m.Time = t
	}
	h := make(nats.Header, len(raw.Header))
	for k, v := range raw.Header {
		switch {
		case strings.HasPrefix(k, hdrParkNats):
			h[k[len(hdrParkNats):]] = v
		case strings.HasPrefix(k, hdrParkPrefix), strings.HasPrefix(k, "Nats-"):
		default:
			h[k] = v
		}
	}
	m.Headers = fromNATSHeader(h)
	return m
}

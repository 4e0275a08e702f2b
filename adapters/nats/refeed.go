package nats

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// refeedRetry is how often the re-feeder looks again after a failed
// park-stream request.
const refeedRetry = 200 * time.Millisecond

// refeedLoop hands spilled messages back to the engine, in order, once their
// tenant has nothing left in flight from the consumer.
func (s *Source) refeedLoop(ctx context.Context, d consumer.Dispatcher) {
	retry := time.NewTimer(refeedRetry)
	defer retry.Stop()
	var work []*tenantState
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-retry.C:
		}
		work = work[:0]
		s.mu.Lock()
		for _, st := range s.tenants {
			if st.spilling {
				work = append(work, st)
			}
		}
		s.mu.Unlock()
		failed := false
		for _, st := range work {
			if !s.refeed(ctx, d, st) {
				failed = true
			}
		}
		clear(work)
		if failed || len(work) > 0 {
			retry.Reset(refeedRetry)
		}
	}
}

// refeed advances one spilling tenant: purges what was settled, re-feeds up
// to the tenant limit, or ends spill mode when the park subject is drained.
// It reports false when a park-stream request failed.
func (s *Source) refeed(ctx context.Context, d consumer.Dispatcher, st *tenantState) bool {
	s.mu.Lock()
	// Everything re-fed below the oldest unsettled re-fed message is
	// settled: one purge removes it all, off the engine's settle path.
	below := st.cursor
	if len(st.inflightPark) > 0 {
		below = st.inflightPark[0]
	}
	purge := below > st.purgedBelow
	tenant := st.key
	s.mu.Unlock()
	ok := true
	if purge {
		err := s.park.Purge(ctx, jetstream.WithPurgeSubject(dlq.NATSSubject(s.opt.parkPrefix, tenant)), jetstream.WithPurgeSequence(below))
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("ringfence nats: purge settled park messages", "tenant", tenant, "err", err)
			}
			return false
		}
		s.mu.Lock()
		st.purgedBelow = max(st.purgedBelow, below)
		s.mu.Unlock()
	}

	for ctx.Err() == nil {
		s.mu.Lock()
		if !st.spilling || st.heldMain > 0 || st.parkPaused {
			s.mu.Unlock()
			return ok
		}
		if st.refed >= st.spilled {
			if st.spillBusy || st.heldPark > 0 || st.purgedBelow < st.cursor {
				s.mu.Unlock()
				return ok
			}
			// The counts say drained; make sure the subject agrees (a spill
			// whose PubAck was lost may have been stored anyway).
			spilled, cursor, tenant := st.spilled, st.cursor, st.key
			s.mu.Unlock()
			_, err := s.park.GetMsg(ctx, cursor, jetstream.WithGetMsgSubject(dlq.NATSSubject(s.opt.parkPrefix, tenant)))
			switch {
			case err == nil:
				s.mu.Lock()
				st.spilled++ // one more to re-feed than counted
				s.mu.Unlock()
				continue
			case !errors.Is(err, jetstream.ErrMsgNotFound):
				return false
			}
			s.mu.Lock()
			if st.spilled != spilled || st.spillBusy || st.heldMain > 0 || st.heldPark > 0 {
				s.mu.Unlock()
				continue // a spill landed meanwhile
			}
			// Drained: the tenant's messages flow directly again.
			st.spilling = false
			st.spilled, st.refed, st.purgedBelow = 0, 0, 0
			assigned, part := st.assigned, st.part
			st.assigned = false
			delete(s.parkPart, part)
			s.dropIfIdleLocked(st)
			s.mu.Unlock()
			if assigned {
				d.Revoked(part)
			}
			return ok
		}
		if st.heldPark >= s.opt.tenantLimit {
			s.mu.Unlock()
			return ok
		}
		if !st.assigned {
			st.part = consumer.Partition{Topic: s.part.Topic + "/park/" + dlq.TenantToken(st.key)}
			st.assigned = true
			s.parkPart[st.part] = st
			s.mu.Unlock()
			d.Assigned(st.part)
			s.mu.Lock()
		}
		cursor, tenant, part := st.cursor, st.key, st.part
		s.mu.Unlock()

		raw, err := s.park.GetMsg(ctx, cursor, jetstream.WithGetMsgSubject(dlq.NATSSubject(s.opt.parkPrefix, tenant)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			// Counts say more should be there (e.g. an earlier run's
			// records were deleted meanwhile): trust the stream.
			s.mu.Lock()
			st.refed = st.spilled
			s.mu.Unlock()
			continue
		}
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("ringfence nats: read park stream", "tenant", tenant, "err", err)
			}
			return false
		}
		m := s.parkedMessage(raw, tenant, part)
		s.mu.Lock()
		st.cursor = raw.Sequence + 1
		st.refed++
		st.heldPark++
		st.inflightPark = append(st.inflightPark, raw.Sequence)
		s.mu.Unlock()
		s.refedTotal.Add(1)
		d.Deliver(m)
	}
	return ok
}

// parkedMessage rebuilds the original message from its park-stream copy.
func (s *Source) parkedMessage(raw *jetstream.RawStreamMsg, tenant string, part consumer.Partition) *consumer.Message {
	m := &consumer.Message{
		Value:     raw.Data,
		Topic:     raw.Header.Get(hdrParkSubject),
		Partition: part,
		Stream:    s.stream,
		Time:      raw.Time,
	}
	pm := &parkedMsg{seq: raw.Sequence, tenant: tenant}
	pm.origSeq, _ = strconv.ParseUint(raw.Header.Get(hdrParkSeq), 10, 64)
	m.Offset = int64(pm.origSeq) // the DLQ record names the original sequence
	m.Handle = pm
	if t, err := time.Parse(time.RFC3339Nano, raw.Header.Get(hdrParkTime)); err == nil {
		m.Time = t
	}
	h := make(map[string][]string, len(raw.Header))
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

// Refed reports whether m was re-fed from the park stream (its Offset is
// still its sequence in the consumer's stream).
func Refed(m *consumer.Message) bool {
	_, ok := m.Handle.(*parkedMsg)
	return ok
}

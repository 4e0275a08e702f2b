package nats

// Appending to the spill log: records built (out of line when they must
// be) and published so that what lands is always in order.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// Bounds of one atomic batch (see SpillLog.Append). The server takes up to
// 1000 messages per batch; the engine appends at most 256 at a time.
const (
	atomicMaxMsgs  = 1000
	atomicMaxBytes = 8 << 20
)

// atomicMinMsgs is the smallest append sent as an atomic batch. The server
// stages each atomic batch in a store of its own, made and removed per
// batch, so a small batch costs more that way than one record at a time
// with a PubAck each, and a large one less; BenchmarkSpillLog guards the
// crossing. A lane's appends are what arrived while its last append was
// out, so most are small. Both ways land a prefix of the batch, in order.
const atomicMinMsgs = 64

// spillRec is one record ready to publish.
type spillRec struct {
	msg  *nats.Msg
	body string // its out-of-line body, if any
	size int
}

// record builds m's spill record for lane's subject, storing its body out
// of line when it must.
func (s *SpillLog) record(ctx context.Context, lane consumer.SpillLane, subj string, m *consumer.Message) (spillRec, error) {
	tok := dlq.TenantToken(lane.Tenant)
	h, inline := spillHeaders(lane.Tenant, tok, m)
	if inline {
		if full, n, ok := inlineRecord(h, m, s.limit()); ok {
			return spillRec{msg: &nats.Msg{Subject: subj, Header: full, Data: m.Value}, size: int(n)}, nil
		}
	}
	// Out of line: the original (key, headers, value, tenant) goes to the
	// bucket, the record keeps the spill headers and names the object.
	ref, err := s.bodies.put(ctx, tok, encodeBody(lane.Tenant, m.Key, m.Value, m.Headers))
	if err != nil {
		return spillRec{}, fmt.Errorf("nats: spill append: %w", err)
	}
	h[hdrSpillBody] = []string{ref}
	n := msgSize(h, nil)
	if n > min(s.limit(), maxHeaderBlock) {
		s.bodies.drop(ctx, ref)
		return spillRec{}, fmt.Errorf("nats: spill append: even the record pointing to the stored body is %d bytes, more than the %d the server or stream %s accepts: %w", n, min(s.limit(), maxHeaderBlock), s.name, dlq.ErrUnwritable)
	}
	return spillRec{msg: &nats.Msg{Subject: subj, Header: h}, body: ref, size: int(n)}, nil
}

// Append implements consumer.SpillLog: it stores msgs in lane's subject,
// in order, and returns once the server acknowledged them all. On an error
// the records that landed are a prefix of msgs: an atomic batch lands
// whole or not at all, and one record at a time stops at the first
// failure. Pipelined asynchronous publishes would be faster but could land
// a later record after an earlier one was refused (a transient refusal, a
// leader change); appending again would then put the earlier one behind
// it, out of order, where the engine's re-feed, which drops a record whose
// offset is not above the last one it took, would lose it.
func (s *SpillLog) Append(ctx context.Context, lane consumer.SpillLane, msgs []*consumer.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if err := s.connected(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opt.timeout)
	defer cancel()
	subj := s.subject(lane)
	recs := make([]spillRec, 0, len(msgs))
	for _, m := range msgs {
		r, err := s.record(ctx, lane, subj, m)
		if err != nil {
			s.dropBodies(ctx, recs)
			return err
		}
		recs = append(recs, r)
	}
	if !s.atomic || len(recs) < s.atomicMin {
		return s.appendEach(ctx, recs)
	}
	for len(recs) > 0 {
		n, size := 0, 0
		for n < len(recs) && n < atomicMaxMsgs && (n == 0 || size+recs[n].size <= atomicMaxBytes) {
			size += recs[n].size
			n++
		}
		err := s.appendBatch(ctx, recs[:n])
		var api *jetstream.APIError
		if errors.As(err, &api) && api.ErrorCode == jsAtomicDuplicate {
			// Some of them were stored before (a retry after a lost
			// acknowledgement, or a redelivery): one at a time, the stream
			// drops those and keeps the rest, in order.
			return s.appendEach(ctx, recs)
		}
		if err != nil {
			if refused(err) {
				s.dropBodies(ctx, recs)
			} else {
				s.dropBodies(ctx, recs[n:]) // never sent
			}
			return fmt.Errorf("nats: spill append to %s: %w", subj, err)
		}
		s.batches.Add(1)
		s.stored(recs[:n])
		recs = recs[n:]
	}
	return nil
}

// jsAtomicDuplicate is JetStream's error code for an atomic batch holding a
// Nats-Msg-Id the stream has seen (nats.go names no constant for it).
const jsAtomicDuplicate jetstream.ErrorCode = 10201

// errDisconnected: a spill log call found the connection down.
var errDisconnected = errors.New("nats: spill log: not connected")

// connected fails while the connection is down: what is published then
// waits in the client's reconnect buffer and reaches the server after the
// caller gave up (an atomic batch would open there and never commit), and
// the engine retries the call anyway.
func (s *SpillLog) connected() error {
	if nc := s.js.Conn(); !nc.IsConnected() {
		return fmt.Errorf("%w (%v)", errDisconnected, nc.Status())
	}
	return nil
}

// appendBatch publishes recs as one atomic batch: all are stored, or none.
func (s *SpillLog) appendBatch(ctx context.Context, recs []spillRec) error {
	var id [16]byte
	_, _ = rand.Read(id[:])
	batch := hex.EncodeToString(id[:])
	defer func() {
		for _, r := range recs {
			delete(r.msg.Header, "Nats-Batch-Id")
			delete(r.msg.Header, "Nats-Batch-Sequence")
			delete(r.msg.Header, "Nats-Batch-Commit")
		}
	}()
	nc := s.js.Conn()
	for i, r := range recs {
		r.msg.Header["Nats-Batch-Id"] = []string{batch}
		r.msg.Header["Nats-Batch-Sequence"] = []string{strconv.Itoa(i + 1)}
		if i == len(recs)-1 {
			r.msg.Header["Nats-Batch-Commit"] = []string{"1"}
			break
		}
		if err := nc.PublishMsg(r.msg); err != nil {
			return err
		}
	}
	_, err := s.js.PublishMsg(ctx, recs[len(recs)-1].msg)
	return err
}

// appendEach publishes recs one at a time, each after the previous one's
// PubAck, so that what lands is a prefix of recs.
func (s *SpillLog) appendEach(ctx context.Context, recs []spillRec) error {
	for i, r := range recs {
		ack, err := s.js.PublishMsg(ctx, r.msg)
		if err != nil {
			if refused(err) {
				s.dropBodies(ctx, recs[i:])
			} else {
				s.dropBodies(ctx, recs[i+1:]) // recs[i] may have landed
			}
			return fmt.Errorf("nats: spill append to %s: %w", r.msg.Subject, err)
		}
		if ack.Duplicate {
			s.duplicates.Add(1)
			if r.body != "" {
				s.bodies.drop(ctx, r.body) // the copy stored before has its own
			}
			continue
		}
		s.stored(recs[i : i+1])
	}
	return nil
}

// stored counts records the stream took (out-of-line ones first, so that
// Stats never shows more appended than stored out of line for them).
func (s *SpillLog) stored(recs []spillRec) {
	for _, r := range recs {
		if r.body != "" {
			s.outOfLine.Add(1)
		}
	}
	s.appended.Add(uint64(len(recs)))
}

// dropBodies deletes the bodies of records that were not stored.
func (s *SpillLog) dropBodies(ctx context.Context, recs []spillRec) {
	for _, r := range recs {
		if r.body != "" {
			s.bodies.drop(context.WithoutCancel(ctx), r.body)
		}
	}
}

// refused reports whether a publish failed because it was refused (by the
// server's answer, or by the client before sending), so the message was
// not stored. Other errors (a timeout, a lost connection) leave it unknown.
func refused(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) || errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadHeaderMsg) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

package nats

// Reading the spill log back: batched direct gets, the stream leader's
// word on an empty answer, and the restoration of the original message.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer"
)

// readMaxBytes caps the bytes one batched direct get sends back, well
// below the client's default pending limit for a subscription (64 MiB).
const readMaxBytes = 8 << 20

// rawRec is one stored record as read.
type rawRec struct {
	seq  uint64
	hdr  nats.Header
	data []byte
	time time.Time
}

// Read implements consumer.SpillLog: up to max records of lane's subject
// at sequences >= from (from < 0: from the first one), restored to the
// original messages, with Refed set and SpillPos their sequence.
func (s *SpillLog) Read(ctx context.Context, lane consumer.SpillLane, from int64, max int) ([]*consumer.Message, error) {
	if max <= 0 {
		return nil, nil
	}
	if err := s.connected(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opt.timeout)
	defer cancel()
	subj := s.subject(lane)
	start := uint64(0)
	if from > 0 {
		start = uint64(from)
	}
	var recs []rawRec
	var err error
	if s.direct {
		recs, err = s.directBatch(ctx, subj, start, max)
		if err == nil && len(recs) == 0 {
			// A replica answering a direct get may lag behind the leader:
			// only the leader may say the log is read to its end (the
			// engine then lets the tenant's messages flow directly).
			recs, err = s.leaderRead(ctx, subj, start, 1)
		}
	} else {
		recs, err = s.leaderRead(ctx, subj, start, max)
	}
	if err != nil {
		return nil, fmt.Errorf("nats: spill read %s: %w", subj, err)
	}
	out := make([]*consumer.Message, 0, len(recs))
	for _, r := range recs {
		m, err := s.message(ctx, subj, lane, r)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	s.read.Add(uint64(len(out)))
	return out, nil
}

// directGetRequest is JetStream's message get request (batched when sent
// to the direct get API).
type directGetRequest struct {
	Seq      uint64 `json:"seq,omitempty"`
	NextFor  string `json:"next_by_subj,omitempty"`
	Batch    int    `json:"batch,omitempty"`
	MaxBytes int    `json:"max_bytes,omitempty"`
}

// directBatch reads up to max records of subj from start with one batched
// direct get: the server sends the records, then an end-of-batch status
// (or "not found" when there is none).
func (s *SpillLog) directBatch(ctx context.Context, subj string, start uint64, max int) ([]rawRec, error) {
	nc := s.js.Conn()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	req, _ := json.Marshal(directGetRequest{Seq: start, NextFor: subj, Batch: max, MaxBytes: readMaxBytes})
	if err := nc.PublishRequest(s.api+"DIRECT.GET."+s.name, inbox, req); err != nil {
		return nil, err
	}
	var out []rawRec
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, err
		}
		sseq := m.Header.Get(jetstream.SequenceHeader)
		if sseq == "" {
			// A status, not a record (a record always comes with its
			// sequence; its own headers may have any name).
			switch status := m.Header.Get("Status"); status {
			case "204", "404": // end of batch; nothing (more) there
				return out, nil
			case "503":
				return nil, nats.ErrNoResponders
			default:
				return nil, fmt.Errorf("direct get: status %q %s", status, m.Header.Get("Description"))
			}
		}
		seq, err := strconv.ParseUint(sseq, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("direct get: bad %s header: %w", jetstream.SequenceHeader, err)
		}
		tm, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
		out = append(out, rawRec{seq: seq, hdr: m.Header, data: m.Data, time: tm})
		if len(out) > max {
			return nil, fmt.Errorf("direct get: more than the %d records asked for", max)
		}
	}
}

// msgGetResponse is JetStream's answer to a message get sent to the
// stream leader.
type msgGetResponse struct {
	Error *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error,omitempty"`
	Message *struct {
		Sequence uint64    `json:"seq"`
		Header   []byte    `json:"hdrs,omitempty"`
		Data     []byte    `json:"data,omitempty"`
		Time     time.Time `json:"time"`
	} `json:"message,omitempty"`
}

// jsNoMessageFound is JetStream's error code for a get that found nothing.
const jsNoMessageFound = 10037

// leaderRead reads up to max records of subj from start, one request each,
// answered by the stream leader (never a lagging replica).
func (s *SpillLog) leaderRead(ctx context.Context, subj string, start uint64, max int) ([]rawRec, error) {
	nc := s.js.Conn()
	var out []rawRec
	for len(out) < max {
		req, _ := json.Marshal(directGetRequest{Seq: start, NextFor: subj})
		resp, err := nc.RequestWithContext(ctx, s.api+"STREAM.MSG.GET."+s.name, req)
		if err != nil {
			return nil, err
		}
		var r msgGetResponse
		if err := json.Unmarshal(resp.Data, &r); err != nil {
			return nil, fmt.Errorf("message get: %w", err)
		}
		switch {
		case r.Error != nil && r.Error.ErrCode == jsNoMessageFound:
			return out, nil
		case r.Error != nil:
			return nil, &jetstream.APIError{Code: r.Error.Code, ErrorCode: jetstream.ErrorCode(r.Error.ErrCode), Description: r.Error.Description}
		case r.Message == nil:
			return nil, jetstream.ErrInvalidJetStreamResponse
		}
		var h nats.Header
		if len(r.Message.Header) > 0 {
			if h, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
				return nil, fmt.Errorf("message get: %w", err)
			}
		}
		out = append(out, rawRec{seq: r.Message.Sequence, hdr: h, data: r.Message.Data, time: r.Message.Time})
		start = r.Message.Sequence + 1
	}
	return out, nil
}

// message restores the original message of record r of lane.
func (s *SpillLog) message(ctx context.Context, subj string, lane consumer.SpillLane, r rawRec) (*consumer.Message, error) {
	m, ref, err := restoreRecord(r.hdr, r.data, lane.Partition)
	if err != nil {
		return nil, fmt.Errorf("nats: spill read %s sequence %d: %w", subj, r.seq, err)
	}
	m.SpillPos = int64(r.seq)
	if _, ok := r.hdr[hdrSpillTime]; !ok {
		m.Time = r.time
	}
	if ref == "" {
		return m, nil
	}
	b, err := s.bodies.get(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("nats: spill read %s sequence %d: %w", subj, r.seq, err)
	}
	if _, m.Key, m.Value, m.Headers, err = decodeBody(b); err != nil {
		return nil, fmt.Errorf("nats: spill read %s sequence %d: %w", subj, r.seq, err)
	}
	s.mu.Lock()
	if s.refs[subj] == nil {
		s.refs[subj] = make(map[uint64]string)
	}
	s.refs[subj][r.seq] = ref
	s.mu.Unlock()
	return m, nil
}

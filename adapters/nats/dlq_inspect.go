package nats

// The DLQ as a dlq.Inspector: scanning the stream's headers, grouping
// copies, and Tenants, Peek, Replay and Purge.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/dlq"
)

// stored is one DLQ message as a scan sees it (headers only).
type stored struct {
	seq    uint64
	time   time.Time
	token  string
	letter string // its dead letter: the record's ID, or "#<seq>" without one
	rec    dlq.Record
	body   string // hdrBody, if stored out of line
}

// scan reads the headers of every message on subjects matching filter, in
// stream order, and calls fn for each under the DLQ's prefix.
func (q *DLQ) scan(ctx context.Context, filter string, fn func(*stored)) error {
	cons, err := q.js.OrderedConsumer(ctx, q.name, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, HeadersOnly: true, InactiveThreshold: scanInactive,
	})
	if err != nil {
		return fmt.Errorf("nats: dlq read %s: %w", filter, err)
	}
	defer func() {
		if ci := cons.CachedInfo(); ci != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = q.js.DeleteConsumer(dctx, q.name, ci.Name)
		}
	}()
	for idle := 0; idle < scanIdle; {
		batch, err := cons.FetchNoWait(scanBatch)
		if err != nil {
			return fmt.Errorf("nats: dlq read %s: %w", filter, err)
		}
		got, last := 0, false
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("nats: dlq read %s: %w", filter, err)
			}
			last = md.NumPending == 0
			s, err := q.storedOf(m.Subject(), md.Sequence.Stream, md.Timestamp, m.Headers())
			if err != nil {
				return err
			}
			if s != nil {
				fn(s)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("nats: dlq read %s: %w", filter, err)
		}
		if last {
			return nil
		}
		if got == 0 {
			idle++
		} else {
			idle = 0
		}
	}
	return nil
}

// storedOf decodes the headers of a DLQ message; nil for a subject that is
// not a tenant's.
func (q *DLQ) storedOf(subject string, seq uint64, t time.Time, h nats.Header) (*stored, error) {
	tok, ok := dlq.SplitNATSSubject(q.prefix, subject)
	if !ok {
		return nil, nil
	}
	s := &stored{seq: seq, time: t, token: tok}
	hs, body := recordHeaders(h)
	s.body = body
	rec, err := dlq.DecodeRecord(nil, nil, hs)
	if err != nil {
		if !q.marked {
			return nil, fmt.Errorf("%w: stream %s holds a message that is not a ringfence record (sequence %d, subject %s); refusing to touch it", dlq.ErrNotDLQ, q.name, seq, subject)
		}
		rec = dlq.Record{Offset: -1}
	}
	s.rec = rec
	if id, ok := rec.ID(); ok {
		s.letter = id.String()
	} else {
		s.letter = fmt.Sprintf("#%d", seq)
	}
	return s, nil
}

// recordHeaders turns a stored message's header into record headers: the
// original "Nats-" headers renamed back, the server's and the DLQ's own
// "Nats-" headers dropped, and hdrBody taken out.
func recordHeaders(h nats.Header) (hs []dlq.Header, body string) {
	for _, x := range fromNATSHeader(h) {
		switch {
		case strings.HasPrefix(x.Key, "Nats-"):
			continue
		case strings.EqualFold(x.Key, hdrBody):
			body = string(x.Value)
			continue
		}
		if k, ok := strings.CutPrefix(x.Key, hdrDLQNats); ok {
			x.Key = k
		}
		hs = append(hs, x)
	}
	return hs, body
}

// letterSet is one tenant's dead letters, in order of first copy.
type letterSet struct {
	copies [][]*stored // per dead letter, its copies in stream order
}

func group(ss []*stored) letterSet {
	at := map[string]int{}
	var ls letterSet
	for _, s := range ss {
		if i, ok := at[s.letter]; ok {
			ls.copies[i] = append(ls.copies[i], s)
			continue
		}
		at[s.letter] = len(ls.copies)
		ls.copies = append(ls.copies, []*stored{s})
	}
	return ls
}

// tenantLetters scans the tenant's subject.
func (q *DLQ) tenantLetters(ctx context.Context, tenant string) (letterSet, error) {
	var ss []*stored
	if err := q.scan(ctx, q.Subject(tenant), func(s *stored) { ss = append(ss, s) }); err != nil {
		return letterSet{}, err
	}
	return group(ss), nil
}

// Tenants lists every tenant with dead letters, sorted by raw key, from one
// scan of the records' headers. Count counts copies of one message once;
// Oldest and Newest are when the first and last records were written;
// LastError is the newest record's; Reason is the most common among the
// dead letters.
func (q *DLQ) Tenants(ctx context.Context) ([]dlq.TenantSummary, error) {
	byToken := map[string][]*stored{}
	var tokens []string
	err := q.scan(ctx, q.prefix+".>", func(s *stored) {
		if _, ok := byToken[s.token]; !ok {
			tokens = append(tokens, s.token)
		}
		byToken[s.token] = append(byToken[s.token], s)
	})
	if err != nil {
		return nil, err
	}
	out := make([]dlq.TenantSummary, 0, len(tokens))
	for _, tok := range tokens {
		ss := byToken[tok]
		ls := group(ss)
		newest := ss[len(ss)-1]
		sum := dlq.TenantSummary{
			Token: tok, Count: len(ls.copies), Records: len(ss),
			Oldest: ss[0].time, Newest: newest.time, LastError: newest.rec.Error,
		}
		counts := map[dlq.Reason]int{}
		var order []dlq.Reason
		for _, c := range ls.copies {
			r := c[0].rec.Reason
			if counts[r] == 0 {
				order = append(order, r)
			}
			counts[r]++
		}
		for _, r := range order { // ties: the first seen
			if counts[r] > counts[sum.Reason] {
				sum.Reason = r
			}
		}
		if sum.Tenant, err = q.tenantOf(ctx, tok, newest); err != nil {
			return nil, err
		}
		out = append(out, sum)
	}
	slices.SortFunc(out, func(a, b dlq.TenantSummary) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out, nil
}

// tenantOf returns the raw key of a token: decoded from the token when it
// is exact, else the full key kept in a record.
func (q *DLQ) tenantOf(ctx context.Context, tok string, s *stored) (string, error) {
	if tok == dlq.NoTenantToken {
		return "", nil
	}
	tenant, exact, _ := dlq.ParseTenantToken(tok)
	switch {
	case exact:
		return tenant, nil
	case s.body != "":
		full, _, _, _, err := q.getBody(ctx, s.body)
		if err != nil {
			return "", err
		}
		return full, nil
	case s.rec.Tenant != "":
		return s.rec.Tenant, nil
	}
	return tenant, nil // the readable prefix: the best there is
}

// record reads and decodes one stored message in full, its body restored.
func (q *DLQ) record(ctx context.Context, s *stored) (dlq.Record, error) {
	raw, err := q.stream.GetMsg(ctx, s.seq)
	if err != nil {
		return dlq.Record{}, fmt.Errorf("nats: dlq read sequence %d: %w", s.seq, err)
	}
	hs, body := recordHeaders(raw.Header)
	r, err := dlq.DecodeRecord(nil, raw.Data, hs)
	if err != nil {
		if !q.marked {
			return dlq.Record{}, fmt.Errorf("%w: stream %s holds a message that is not a ringfence record (sequence %d); refusing to touch it", dlq.ErrNotDLQ, q.name, raw.Sequence)
		}
		// Published by something else: shown with its value and headers.
		r = dlq.Record{Value: raw.Data, Headers: hs, Offset: -1}
	}
	if body != "" {
		tenant, key, value, headers, err := q.getBody(ctx, body)
		if err != nil {
			return dlq.Record{}, fmt.Errorf("nats: dlq read sequence %d: %w", raw.Sequence, err)
		}
		r.Tenant, r.Key, r.Value, r.Headers = tenant, key, value, headers
	} else if s.token != dlq.NoTenantToken {
		// NATS trims header values and turns CR/LF into spaces; the
		// subject's token holds the key exactly unless it was hashed.
		if tn, exact, err := dlq.ParseTenantToken(s.token); exact && err == nil {
			r.Tenant = tn
		}
	}
	r.Time = raw.Time
	r.Position = int64(raw.Sequence)
	return r, nil
}

// letter reads a dead letter's first copy and lists its copies.
func (q *DLQ) letter(ctx context.Context, copies []*stored) (dlq.Record, error) {
	r, err := q.record(ctx, copies[0])
	if err != nil {
		return r, err
	}
	r.Copies = make([]dlq.Copy, len(copies))
	for i, c := range copies {
		r.Copies[i] = dlq.Copy{Position: int64(c.seq), Time: c.time}
	}
	return r, nil
}

// Peek returns up to n of the tenant's oldest dead letters (n <= 0: all),
// one record per dead letter with its copies listed.
func (q *DLQ) Peek(ctx context.Context, tenant string, n int) ([]dlq.Record, error) {
	ls, err := q.tenantLetters(ctx, tenant)
	if err != nil {
		return nil, err
	}
	copies := ls.copies
	if n > 0 && len(copies) > n {
		copies = copies[:n]
	}
	out := make([]dlq.Record, 0, len(copies))
	for _, c := range copies {
		r, err := q.letter(ctx, c)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// ErrNoSource: a record cannot be replayed because it does not name its
// source subject. It is one case of ErrNotReplayable (errors.Is matches
// both).
var ErrNoSource = fmt.Errorf("%w: it has no source subject", ErrNotReplayable)

// ErrNotReplayable: a dead letter cannot be republished to NATS as it is
// (it names no source subject, or has a header name NATS messages cannot
// carry, kept by the DLQ out of line). It stays in the DLQ.
var ErrNotReplayable = errors.New("nats: dead letter cannot be replayed to NATS")

// Replay republishes the tenant's oldest dead letters (up to opt.Limit) to
// their source subjects, once each, with the redrive count raised, and
// deletes every copy of each (and its stored body) only after its
// republish was acknowledged: a crash in between duplicates a message,
// never loses one. Nats-Msg-Id and Nats-Expected-* headers are dropped from
// the republished message, since the source stream would otherwise discard
// it as a duplicate or refuse it; the redrive header is left out of a
// message that would no longer fit the server's max payload with it.
func (q *DLQ) Replay(ctx context.Context, tenant string, opt dlq.ReplayOptions) ([]dlq.Record, error) {
	ls, err := q.tenantLetters(ctx, tenant)
	if err != nil {
		return nil, err
	}
	letters := ls.copies
	if opt.Limit > 0 && len(letters) > opt.Limit {
		letters = letters[:opt.Limit]
	}
	recs := make([]dlq.Record, 0, len(letters))
	for _, c := range letters {
		r, err := q.letter(ctx, c)
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	if opt.DryRun {
		return recs, nil
	}
	maxPayload := q.js.Conn().MaxPayload()
	for i := range recs {
		r := &recs[i]
		if r.Source == "" {
			return recs[:i], fmt.Errorf("%w (position %d)", ErrNoSource, r.Position)
		}
		h := make(nats.Header)
		for _, x := range r.ReplayHeaders() {
			if x.Key == jetstream.MsgIDHeader || strings.HasPrefix(x.Key, "Nats-Expected-") {
				continue
			}
			if !validHeaderKey(x.Key) {
				// Published, it would reach the source as a message no NATS
				// client can decode: a poison for every consumer of it.
				return recs[:i], fmt.Errorf("%w: dead letter at position %d has a header named %q, which a NATS message cannot carry; it stays in the DLQ (purge it, or replay it where such headers are valid)", ErrNotReplayable, r.Position, x.Key)
			}
			h[x.Key] = append(h[x.Key], string(x.Value))
		}
		if msgSize(h, r.Value) > maxPayload || msgSize(h, nil) > maxHeaderBlock {
			delete(h, dlq.HeaderRedrive) // the message was at a limit: replay it as it was
		}
		if _, err := q.js.PublishMsg(ctx, &nats.Msg{Subject: r.Source, Header: h, Data: r.Value}); err != nil {
			return recs[:i], fmt.Errorf("nats: dlq replay to %s: %w", r.Source, err)
		}
		if err := q.remove(ctx, letters[i]); err != nil {
			return recs[:i], fmt.Errorf("nats: dlq replay: republished but not removed (it will be replayed again): %w", err)
		}
		r.Redrive++
	}
	return recs, nil
}

// remove deletes stored messages and then their bodies.
func (q *DLQ) remove(ctx context.Context, ss []*stored) error {
	for _, s := range ss {
		if err := q.stream.DeleteMsg(ctx, s.seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return err
		}
	}
	for _, s := range ss {
		if s.body != "" {
			q.dropBody(ctx, s.body)
		}
	}
	return nil
}

// Purge removes the tenant's dead letters, with their copies and stored
// bodies, and returns how many dead letters there were. Records written
// after the scan that found them are kept.
func (q *DLQ) Purge(ctx context.Context, tenant string) (int, error) {
	subj := q.Subject(tenant)
	var ss []*stored
	if err := q.scan(ctx, subj, func(s *stored) { ss = append(ss, s) }); err != nil {
		return 0, err
	}
	if len(ss) == 0 {
		return 0, nil
	}
	last := ss[len(ss)-1].seq
	if err := q.stream.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeSequence(last+1)); err != nil {
		return 0, fmt.Errorf("nats: dlq purge %s: %w", subj, err)
	}
	for _, s := range ss {
		if s.body != "" {
			q.dropBody(ctx, s.body)
		}
	}
	return len(group(ss).copies), nil
}

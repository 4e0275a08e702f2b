package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/dlq"
)

// hdrDLQNats prefixes an original "Nats-" header in a dead letter, so that
// the DLQ stream does not act on it (a Nats-Msg-Id would make the stream
// silently drop a second dead-lettering of the same message as a
// duplicate; a Nats-Expected-* header would make every write fail).
const hdrDLQNats = "ringfence-nats-h-"

// DLQ is a JetStream dead-letter queue: one stream (file storage) with one
// subject per tenant, dlq.NATSSubject(prefix, tenant). It implements
// dlq.Sink and dlq.Inspector and is safe for concurrent use.
type DLQ struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string
	prefix string
}

var (
	_ dlq.Sink      = (*DLQ)(nil)
	_ dlq.Inspector = (*DLQ)(nil)
)

// NewDLQ opens the DLQ stream, creating it if missing. When the server has
// no JetStream it fails with an error wrapping ErrCoreNATS.
func NewDLQ(ctx context.Context, js jetstream.JetStream, opts ...DLQOption) (*DLQ, error) {
	o := dlqOptions{stream: DefaultDLQStream, prefix: DefaultDLQPrefix}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	st, err := ensureStream(ctx, js, o.stream, o.prefix)
	if err != nil {
		return nil, err
	}
	return &DLQ{js: js, stream: st, name: o.stream, prefix: o.prefix}, nil
}

// Subject is the DLQ subject of a tenant ("" is the no-tenant bucket).
func (q *DLQ) Subject(tenant string) string { return dlq.NATSSubject(q.prefix, tenant) }

// Write stores r under its tenant's subject (r.Bucket()) and returns once
// the server acknowledged it. r.Key is not kept: NATS messages have no key.
func (q *DLQ) Write(ctx context.Context, r *dlq.Record) error {
	hs := r.EncodeHeaders()
	h := make(nats.Header, len(hs))
	for _, x := range hs {
		k := x.Key
		if strings.HasPrefix(k, "Nats-") {
			k = hdrDLQNats + k
		}
		h[k] = append(h[k], string(x.Value))
	}
	_, err := q.js.PublishMsg(ctx, &nats.Msg{Subject: q.Subject(r.Bucket()), Header: h, Data: r.Value})
	if err != nil {
		return fmt.Errorf("nats: dlq write: %w", err)
	}
	return nil
}

// decode rebuilds a record from a stored message. A message that is not a
// record (published by something else) comes back with its value and
// headers only.
func (q *DLQ) decode(raw *jetstream.RawStreamMsg, tenant string) dlq.Record {
	hs := make([]dlq.Header, 0, len(raw.Header))
	for _, x := range fromNATSHeader(raw.Header) {
		if k, ok := strings.CutPrefix(x.Key, hdrDLQNats); ok {
			x.Key = k
		}
		hs = append(hs, x)
	}
	r, err := dlq.DecodeRecord(nil, raw.Data, hs)
	if err != nil {
		r = dlq.Record{Tenant: tenant, Value: raw.Data, Headers: hs, Offset: -1}
	}
	// NATS trims header values and turns CR/LF into spaces, so a key with
	// such bytes does not survive in the tenant header; the subject's token
	// holds it exactly unless it was hashed.
	if tok, ok := dlq.SplitNATSSubject(q.prefix, raw.Subject); ok && tok != dlq.NoTenantToken {
		if tn, exact, err := dlq.ParseTenantToken(tok); exact && err == nil {
			r.Tenant = tn
		}
	}
	r.Time = raw.Time
	r.Position = int64(raw.Sequence)
	return r
}

// maxReasonScan caps how many of a tenant's records Tenants reads to find
// the most common reason.
const maxReasonScan = 10000

// Tenants lists every tenant with dead letters, from the stream's
// per-subject counts. Oldest and Newest are when the first and last records
// were written; LastError is the newest record's; Reason is the most common
// among the tenant's oldest 10000 records (read with an ordered consumer,
// headers only matter).
func (q *DLQ) Tenants(ctx context.Context) ([]dlq.TenantSummary, error) {
	info, err := q.stream.Info(ctx, jetstream.WithSubjectFilter(q.prefix+".>"))
	if err != nil {
		return nil, fmt.Errorf("nats: dlq info: %w", err)
	}
	var out []dlq.TenantSummary
	for subj, n := range info.State.Subjects {
		tok, ok := dlq.SplitNATSSubject(q.prefix, subj)
		if !ok || n == 0 {
			continue
		}
		tenant, _, _ := dlq.ParseTenantToken(tok)
		first, err := q.stream.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // purged meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("nats: dlq %s: %w", subj, err)
		}
		last, err := q.stream.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			return nil, fmt.Errorf("nats: dlq %s: %w", subj, err)
		}
		newest := q.decode(last, tenant)
		switch {
		case tok == dlq.NoTenantToken:
			tenant = ""
		case newest.Tenant != "":
			tenant = newest.Tenant // the full key, also for hashed tokens
		}
		out = append(out, dlq.TenantSummary{
			Tenant:    tenant,
			Token:     tok,
			Count:     int(n),
			Oldest:    first.Time,
			Newest:    last.Time,
			Reason:    q.commonReason(ctx, subj, min(int(n), maxReasonScan), newest.Reason),
			LastError: newest.Error,
		})
	}
	slices.SortFunc(out, func(a, b dlq.TenantSummary) int { return strings.Compare(a.Token, b.Token) })
	return out, nil
}

// Peek returns up to n of the tenant's oldest records (n <= 0: all).
func (q *DLQ) Peek(ctx context.Context, tenant string, n int) ([]dlq.Record, error) {
	subj := q.Subject(tenant)
	var out []dlq.Record
	for cursor := uint64(0); n <= 0 || len(out) < n; {
		raw, err := q.stream.GetMsg(ctx, cursor, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return out, fmt.Errorf("nats: dlq peek %s: %w", subj, err)
		}
		out = append(out, q.decode(raw, tenant))
		cursor = raw.Sequence + 1
	}
	return out, nil
}

// ErrNoSource: a record cannot be replayed because it does not name its
// source subject.
var ErrNoSource = errors.New("nats: dead letter has no source subject")

// Replay republishes the tenant's oldest records (up to opt.Limit) to their
// source subjects with the redrive count raised, and deletes each from the
// DLQ only after its republish was acknowledged: a crash in between
// duplicates a message, never loses one. Nats-Msg-Id and Nats-Expected-*
// headers are dropped from the republished message, since the source stream
// would otherwise discard it as a duplicate or refuse it.
func (q *DLQ) Replay(ctx context.Context, tenant string, opt dlq.ReplayOptions) ([]dlq.Record, error) {
	recs, err := q.Peek(ctx, tenant, opt.Limit)
	if err != nil || opt.DryRun {
		return recs, err
	}
	for i := range recs {
		r := &recs[i]
		if r.Source == "" {
			return recs[:i], fmt.Errorf("%w (position %d)", ErrNoSource, r.Position)
		}
		h := make(nats.Header)
		for _, x := range r.ReplayHeaders() {
			if x.Key == "Nats-Msg-Id" || strings.HasPrefix(x.Key, "Nats-Expected-") {
				continue
			}
			h[x.Key] = append(h[x.Key], string(x.Value))
		}
		if _, err := q.js.PublishMsg(ctx, &nats.Msg{Subject: r.Source, Header: h, Data: r.Value}); err != nil {
			return recs[:i], fmt.Errorf("nats: dlq replay to %s: %w", r.Source, err)
		}
		if err := q.stream.DeleteMsg(ctx, uint64(r.Position)); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return recs[:i], fmt.Errorf("nats: dlq replay: republished but not deleted (it will be replayed again): %w", err)
		}
		r.Redrive++
	}
	return recs, nil
}

// Purge removes the tenant's dead letters and returns how many.
func (q *DLQ) Purge(ctx context.Context, tenant string) (int, error) {
	req, err := json.Marshal(jetstream.StreamPurgeRequest{Subject: q.Subject(tenant)})
	if err != nil {
		return 0, err
	}
	// jetstream.Stream.Purge does not return the count, so send the API
	// request ourselves, with the prefix jetstream.New would use.
	prefix := jetstream.DefaultAPIPrefix
	switch o := q.js.Options(); {
	case o.Domain != "":
		prefix = "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		prefix = strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	subj := prefix + "STREAM.PURGE." + q.name
	rctx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	msg, err := q.js.Conn().RequestWithContext(rctx, subj, req)
	if err != nil {
		return 0, fmt.Errorf("nats: dlq purge: %w", err)
	}
	var resp struct {
		Success bool                `json:"success"`
		Purged  uint64              `json:"purged"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("nats: dlq purge: %w", err)
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("nats: dlq purge: %w", resp.Error)
	}
	return int(resp.Purged), nil
}

// commonReason reads up to n records of subj and returns their most common
// reason (ties: the first seen), or fallback when they cannot be read.
func (q *DLQ) commonReason(ctx context.Context, subj string, n int, fallback dlq.Reason) dlq.Reason {
	if n <= 1 {
		return fallback
	}
	cons, err := q.js.OrderedConsumer(ctx, q.name, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		return fallback
	}
	counts := map[dlq.Reason]int{}
	var order []dlq.Reason
	for read := 0; read < n; {
		batch, err := cons.FetchNoWait(min(n-read, 500))
		if err != nil {
			return fallback
		}
		got := 0
		for m := range batch.Messages() {
			got++
			var r dlq.Reason
			for k, v := range m.Headers() {
				if len(v) > 0 && strings.EqualFold(k, dlq.HeaderReason) {
					r = dlq.Reason(v[0])
				}
			}
			if counts[r] == 0 {
				order = append(order, r)
			}
			counts[r]++
		}
		if batch.Error() != nil || got == 0 {
			break
		}
		read += got
	}
	best := fallback
	for _, r := range order {
		if counts[r] > counts[best] {
			best = r
		}
	}
	return best
}

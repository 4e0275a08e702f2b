package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/dlq"
)

const (
	// replayChunk is how many dead letters Replay republishes before it
	// marks them moved and advances the cursor: the most a crash mid-replay
	// can duplicate.
	replayChunk = 100
	// markerIDs caps how many IDs one MarkerMoved record lists.
	markerIDs = 5000
	// fetchMaxBytes is what one fetch of a DLQ partition asks for; a
	// larger record still comes back whole (a broker returns at least one
	// batch).
	fetchMaxBytes = 16 << 20
)

// bounds is the package's bounds of topic through the DLQ's client.
// kafka-go's Transport answers Metadata from a cache it refreshes every
// 6s, so a topic another client made since (a DLQ writing a tenant's
// first dead letter, or writing it again after DLQDeleteDrained) is unknown
// to it until then: on UnknownTopicOrPartition the DLQ renews its
// transport, whose first Metadata comes from the broker, and asks once
// more. A DLQ that lives long (the ops console's) would otherwise
// show no dead letters for a tenant that has some.
func (q *DLQ) bounds(ctx context.Context, topic string) (starts, ends map[int]int64, err error) {
	starts, ends, err = bounds(ctx, q.client, topic)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) {
		q.tr.renew()
		starts, ends, err = bounds(ctx, q.client, topic)
	}
	return starts, ends, err
}

// renewingTransport is a kafka-go Transport that renew replaces with a
// new one (and an empty metadata cache). Requests in flight on the old
// one finish: its connections close as they go idle.
type renewingTransport struct {
	dialer *kafkago.Dialer
	cur    atomic.Pointer[kafkago.Transport]
}

func newRenewingTransport(d *kafkago.Dialer) *renewingTransport {
	t := &renewingTransport{dialer: d}
	t.cur.Store(transportFor(d))
	return t
}

func (t *renewingTransport) RoundTrip(ctx context.Context, addr net.Addr, req kafkago.Request) (kafkago.Response, error) {
	return t.cur.Load().RoundTrip(ctx, addr, req)
}

func (t *renewingTransport) renew() {
	t.cur.Swap(transportFor(t.dialer)).CloseIdleConnections()
}

// Topics returns the source's DLQ topics that exist: the per-tenant topics
// "<source>.dlq.<token>", or the shared topic. None means that nothing was
// ever dead-lettered from this source (or the source is misspelt).
func (q *DLQ) Topics(ctx context.Context) ([]string, error) {
	if q.cfg.shared == "" {
		return q.tenantTopics(ctx)
	}
	_, ends, err := q.bounds(ctx, q.cfg.shared)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) || err == nil && len(ends) == 0 {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return []string{q.cfg.shared}, nil
}

// entry is one dead-letter record with where it lives.
type entry struct {
	rec       dlq.Record
	partition int
	offset    int64
	moved     bool // a MarkerMoved lists its dead letter
}

// letter is what identifies a dead letter in a DLQ: its tenant's token and
// its ID, or for a record without an ID its position.
type letter struct {
	token string
	id    string
}

func letterOf(e *entry) letter {
	l := letter{token: dlq.TenantToken(e.rec.Bucket())}
	if id, ok := e.rec.ID(); ok {
		l.id = id.String()
	} else {
		l.id = "@" + strconv.Itoa(e.partition) + "/" + strconv.FormatInt(e.offset, 10)
	}
	return l
}

// view is what lies beyond the cursor in one DLQ topic for one cursor
// group: every dead-letter record kept, moved or not, in time order.
type view struct {
	topic string
	group string
	all   []entry
	ends  map[int]int64 // high watermark per partition at read time
}

// deadLetter is one dead letter: its first copy, with Copies listing all.
type deadLetter struct {
	l   letter
	rec dlq.Record
}

// collapse returns one deadLetter per letter among es that is not moved,
// in order of first copy. It is dlq.Collapse, keyed by letter so that a
// record without an ID is told apart by its partition too.
func collapse(es []entry) []deadLetter {
	at := map[letter]int{}
	var out []deadLetter
	for i := range es {
		e := &es[i]
		if e.moved {
			continue
		}
		l := letterOf(e)
		c := dlq.Copy{Position: e.offset, Time: e.rec.Time}
		if j, ok := at[l]; ok {
			out[j].rec.Copies = append(out[j].rec.Copies, c)
			continue
		}
		at[l] = len(out)
		r := e.rec
		r.Copies = []dlq.Copy{c}
		out = append(out, deadLetter{l: l, rec: r})
	}
	return out
}

func records(ls []deadLetter) []dlq.Record {
	out := make([]dlq.Record, len(ls))
	for i := range ls {
		out[i] = ls[i].rec
	}
	return out
}

// Tenants lists every tenant with dead letters past the cursor, sorted by
// raw key. Copies of one message count once in Count.
func (q *DLQ) Tenants(ctx context.Context) ([]dlq.TenantSummary, error) {
	byTenant := map[string][]entry{}
	if q.cfg.shared != "" {
		all, err := q.readShared(ctx)
		if err != nil {
			return nil, err
		}
		byTenant = all
	} else {
		topics, err := q.tenantTopics(ctx)
		if err != nil {
			return nil, err
		}
		for _, topic := range topics {
			v, err := q.read(ctx, topic, q.cfg.cursorGroup, nil)
			if err != nil {
				return nil, err
			}
			for _, e := range v.all {
				if !e.moved {
					b := e.rec.Bucket()
					byTenant[b] = append(byTenant[b], e)
				}
			}
		}
	}
	out := make([]dlq.TenantSummary, 0, len(byTenant))
	for tenant, es := range byTenant {
		if len(es) > 0 {
			out = append(out, summarize(tenant, es))
		}
	}
	slices.SortFunc(out, func(a, b dlq.TenantSummary) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out, nil
}

// summarize describes one tenant's records (copies included, none moved).
func summarize(tenant string, es []entry) dlq.TenantSummary {
	letters := collapse(es)
	s := dlq.TenantSummary{Tenant: tenant, Token: dlq.TenantToken(tenant), Count: len(letters), Records: len(es)}
	var newest time.Time
	for i, e := range es {
		t := e.rec.Time
		if i == 0 || t.Before(s.Oldest) {
			s.Oldest = t
		}
		if i == 0 || !t.Before(newest) {
			newest = t
			s.LastError = e.rec.Error
		}
	}
	s.Newest = newest
	reasons := map[dlq.Reason]int{}
	for _, l := range letters {
		reasons[l.rec.Reason]++
	}
	best := 0
	for r, n := range reasons {
		if n > best || n == best && r < s.Reason {
			s.Reason, best = r, n
		}
	}
	return s
}

// Peek returns up to n of the tenant's oldest dead letters past the cursor
// (n <= 0: all), one record per dead letter with its copies listed.
func (q *DLQ) Peek(ctx context.Context, tenant string, n int) ([]dlq.Record, error) {
	v, err := q.tenantView(ctx, tenant)
	if err != nil {
		return nil, err
	}
	letters := collapse(v.all)
	if n > 0 && len(letters) > n {
		letters = letters[:n]
	}
	return records(letters), nil
}

// Replay republishes the tenant's dead letters to their source topic, on
// their original partition, once each, with the redrive count raised (left
// out for a message that would no longer fit its source topic with it).
// After each chunk is acknowledged it writes a MarkerMoved record listing
// the chunk's dead letters (so their other copies are not shown again) and
// advances the cursor past every record that is done.
func (q *DLQ) Replay(ctx context.Context, tenant string, opt dlq.ReplayOptions) ([]dlq.Record, error) {
	v, err := q.tenantView(ctx, tenant)
	if err != nil {
		return nil, err
	}
	letters := collapse(v.all)
	if opt.Limit > 0 && len(letters) > opt.Limit {
		letters = letters[:opt.Limit]
	}
	if opt.DryRun {
		return records(letters), nil
	}
	token := dlq.TenantToken(tenant)
	done := map[letter]bool{}
	var moved []dlq.Record
	for len(letters) > 0 {
		chunk := letters[:min(replayChunk, len(letters))]
		letters = letters[len(chunk):]
		recs := records(chunk)
		if err := q.republish(ctx, recs); err != nil {
			return moved, err
		}
		ls := make(map[letter]bool, len(chunk))
		for _, l := range chunk {
			ls[l.l] = true
		}
		if err := q.markMoved(ctx, v, token, ls); err != nil {
			return moved, fmt.Errorf("%w (republished, still in the DLQ: a later replay will duplicate them)", err)
		}
		for l := range ls {
			done[l] = true
		}
		if err := q.advance(ctx, v, done); err != nil {
			return moved, err // marked moved: not shown again, nothing duplicated
		}
		moved = append(moved, recs...)
	}
	return moved, nil
}

// republish writes recs to their source topics and partitions and waits
// for the acknowledgements.
func (q *DLQ) republish(ctx context.Context, recs []dlq.Record) error {
	type dest struct {
		topic     string
		partition int
	}
	var order []dest
	byDest := map[dest][]kafkago.Message{}
	limits := map[string]int{}
	now := time.Now()
	for i := range recs {
		r := &recs[i]
		d := dest{topic: r.Source, partition: int(r.Partition)}
		if d.topic == "" {
			d.topic = q.source
		}
		limit, err := q.limits.Do(ctx, d.topic, func(ctx context.Context) (int, error) {
			return topicLimit(ctx, q.client, d.topic)
		})
		if err != nil {
			return err
		}
		limits[d.topic] = limit
		m := kafkago.Message{Key: r.Key, Value: r.Value, Headers: toKafkaHeaders(r.ReplayHeaders()), Time: now}
		if batchSize(&m) > limit {
			// The message was at its topic's limit: replay it as it was,
			// without the redrive count.
			m.Headers = m.Headers[:len(m.Headers)-1]
			if n := batchSize(&m); n > limit {
				return fmt.Errorf("kafka: replay dead letter at %d: %d bytes, more than %s accepts (max.message.bytes %d)", r.Position, n, d.topic, limit)
			}
		}
		if _, ok := byDest[d]; !ok {
			order = append(order, d)
		}
		byDest[d] = append(byDest[d], m)
	}
	for _, d := range order {
		limit := limits[d.topic]
		msgs := byDest[d]
		for len(msgs) > 0 {
			n, size := 0, batchOverhead
			for n < len(msgs) {
				// +2: offset deltas past the first record take up to 2
				// more bytes than recordSize counts.
				s := recordSize(&msgs[n]) + 2
				if n > 0 && size+s > limit {
					break
				}
				size += s
				n++
			}
			if err := produceRecords(ctx, q.client, d.topic, d.partition, msgs[:n]...); err != nil {
				return fmt.Errorf("kafka: replay to %s/%d: %w", d.topic, d.partition, err)
			}
			msgs = msgs[n:]
		}
	}
	return nil
}

// markMoved writes MarkerMoved records listing ls into the partitions of
// v's topic that hold a copy of them.
func (q *DLQ) markMoved(ctx context.Context, v view, token string, ls map[letter]bool) error {
	ids := map[int][]string{}
	seen := map[int]map[letter]bool{}
	for i := range v.all {
		e := &v.all[i]
		l := letterOf(e)
		if !ls[l] || seen[e.partition][l] {
			continue
		}
		if seen[e.partition] == nil {
			seen[e.partition] = map[letter]bool{}
		}
		seen[e.partition][l] = true
		ids[e.partition] = append(ids[e.partition], l.id)
	}
	hs := []kafkago.Header{
		{Key: dlq.HeaderMarker, Value: []byte(dlq.MarkerMoved)},
		{Key: dlq.HeaderTenantToken, Value: []byte(token)},
	}
	for p, list := range ids {
		for len(list) > 0 {
			part := list[:min(markerIDs, len(list))]
			list = list[len(part):]
			m := kafkago.Message{Headers: hs, Value: []byte(strings.Join(part, "\n")), Time: time.Now()}
			if err := produceRecords(ctx, q.client, v.topic, p, m); err != nil {
				return fmt.Errorf("kafka: mark dead letters moved in %s/%d: %w", v.topic, p, err)
			}
		}
	}
	return nil
}

// movedLetters decodes a MarkerMoved record.
func movedLetters(hs []dlq.Header, value []byte) []letter {
	var token string
	for _, h := range hs {
		if strings.EqualFold(h.Key, dlq.HeaderTenantToken) {
			token = string(h.Value)
		}
	}
	var out []letter
	for id := range strings.SplitSeq(string(value), "\n") {
		if id != "" {
			out = append(out, letter{token: token, id: id})
		}
	}
	return out
}

// Purge removes the tenant's dead letters past the cursor, with their
// copies, and returns how many dead letters there were. It writes a
// MarkerMoved record listing them, so that a copy written later (a
// redelivery dead-lettered again) is not shown, and advances the cursor.
// With DLQDeleteDrained, a drained per-tenant topic is deleted instead of
// marked.
func (q *DLQ) Purge(ctx context.Context, tenant string) (int, error) {
	v, err := q.tenantView(ctx, tenant)
	if err != nil {
		return 0, err
	}
	letters := collapse(v.all)
	deleting := q.cfg.deleteDrain && q.cfg.shared == "" && v.topic != ""
	if len(v.all) > 0 {
		done := make(map[letter]bool, len(letters))
		for _, l := range letters {
			done[l.l] = true
		}
		if len(letters) > 0 && !deleting {
			if err := q.markMoved(ctx, v, dlq.TenantToken(tenant), done); err != nil {
				return 0, err
			}
		}
		if err := q.advance(ctx, v, done); err != nil {
			return 0, err
		}
	}
	if deleting {
		if err := q.deleteDrained(ctx, v); err != nil {
			return len(letters), err
		}
	}
	return len(letters), nil
}

// deleteDrained deletes v's topic if nothing arrived since it was read.
// The cursor is first reset to 0 so that a topic of the same name created
// later is read from its start whether or not the broker drops the
// deleted topic's offsets.
func (q *DLQ) deleteDrained(ctx context.Context, v view) error {
	_, ends, err := bounds(ctx, q.client, v.topic)
	if err != nil {
		return err
	}
	for p, end := range ends {
		if end != v.ends[p] {
			return nil // new dead letters arrived: keep the topic
		}
	}
	zero := map[int]int64{}
	for p := range ends {
		zero[p] = 0
	}
	if err := q.commit(ctx, v.group, v.topic, zero); err != nil {
		return err
	}
	resp, err := q.client.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: []string{v.topic}})
	if err != nil {
		return fmt.Errorf("kafka: delete drained %s: %w", v.topic, err)
	}
	if err := resp.Errors[v.topic]; err != nil {
		return fmt.Errorf("kafka: delete drained %s: %w", v.topic, err)
	}
	return nil
}

package kafka

// The shared spill topic: one topic per source, whose partition p holds the
// lanes of source partition p; per partition an index in memory of which
// records are whose, built from the broker and kept up to date by Append.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// sharedPart is what a SpillLog knows of one partition of the shared spill
// topic. mu is a leaf lock, never held across a network call; it guards
// every field.
type sharedPart struct {
	mu    sync.Mutex
	idx   *partIndex // nil until built (Pending drops it)
	gen   uint64     // counts resets; an index built before one is not installed
	queue []*appendReq
	busy  bool // a flush goroutine is sending the queue
}

// partIndex indexes this group's records of one spill partition from the
// floor on. Every record of the group below floor is settled; every record
// below end was seen (read back or appended by this log).
type partIndex struct {
	floor, end int64
	lanes      map[string]*laneIndex // by tenant
	records    int                   // sum of len(offs)
}

// laneIndex is one lane's part of a partIndex.
type laneIndex struct {
	offs   []int64 // the lane's records at or past its cursor and the floor, ascending
	cursor int64   // entries below it are settled (0: no cursor)
	saved  bool    // the cursor topic holds a cursor record of the lane
}

// add indexes tenant's record at off.
func (x *partIndex) add(tenant string, off int64) {
	l := x.lanes[tenant]
	if l == nil {
		l = &laneIndex{}
		x.lanes[tenant] = l
	}
	if off < l.cursor || off < x.floor || len(l.offs) > 0 && l.offs[len(l.offs)-1] >= off {
		return
	}
	l.offs = append(l.offs, off)
	x.records++
}

// settle moves tenant's cursor to next.
func (x *partIndex) settle(tenant string, next int64) {
	l := x.lanes[tenant]
	if l == nil {
		l = &laneIndex{}
		x.lanes[tenant] = l
	}
	l.cursor = max(l.cursor, next)
	l.saved = true
	i, _ := slices.BinarySearch(l.offs, next)
	x.records -= i
	l.offs = l.offs[i:]
}

// lowest returns the position of the oldest unsettled record of the group,
// or end when there is none.
func (x *partIndex) lowest() int64 {
	low := x.end
	for _, l := range x.lanes {
		if len(l.offs) > 0 && l.offs[0] < low {
			low = l.offs[0]
		}
	}
	return low
}

// wanted returns up to limit positions of tenant's records at from or past
// it (from < 0: past its cursor).
func (x *partIndex) wanted(tenant string, from int64, limit int) []int64 {
	l := x.lanes[tenant]
	if l == nil {
		return nil
	}
	if from < 0 {
		from = max(l.cursor, x.floor)
	}
	i, _ := slices.BinarySearch(l.offs, from)
	return slices.Clone(l.offs[i:min(len(l.offs), i+limit)])
}

// pendingLanes returns the tenants with records past their cursor, sorted.
func (x *partIndex) pendingLanes() []string {
	var out []string
	for t, l := range x.lanes {
		if len(l.offs) > 0 {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

// part returns the state of spill partition p (made on first use).
func (s *SpillLog) part(p int) *sharedPart {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	if s.parts == nil {
		s.parts = make(map[int]*sharedPart)
	}
	sp := s.parts[p]
	if sp == nil {
		sp = &sharedPart{}
		s.parts[p] = sp
	}
	return sp
}

// index returns the index of spill partition p, building it from the
// broker first (single-flight per partition and reset).
func (s *SpillLog) index(ctx context.Context, p int) (*sharedPart, error) {
	sp := s.part(p)
	for range 3 {
		sp.mu.Lock()
		built, gen := sp.idx != nil, sp.gen
		sp.mu.Unlock()
		if built {
			return sp, nil
		}
		key := strconv.Itoa(p) + "/" + strconv.FormatUint(gen, 10)
		_, err := s.builds.Do(ctx, key, func(ctx context.Context) (struct{}, error) {
			x, err := s.buildIndex(ctx, p)
			if err != nil {
				return struct{}{}, err
			}
			sp.mu.Lock()
			if sp.gen == gen && sp.idx == nil {
				sp.idx = x
			}
			sp.mu.Unlock()
			return struct{}{}, nil
		})
		s.builds.Forget(key, nil)
		if err != nil {
			return sp, err
		}
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.idx == nil {
		return sp, fmt.Errorf("kafka: spill index of %s/%d reset while it was built", s.shared, p)
	}
	return sp, nil
}

// reset drops the index of sp: the next use builds it again from the
// broker.
func (sp *sharedPart) reset() {
	sp.mu.Lock()
	sp.idx = nil
	sp.gen++
	sp.mu.Unlock()
}

// buildIndex reads spill partition p's state from the broker: the floor
// (the cursor group's committed offset), the lanes' cursors (the cursor
// topic's partition p) and the group's records from the floor to the end.
// Its cost is one pass over the records past the floor: those of the
// oldest unsettled lane of the partition on.
func (s *SpillLog) buildIndex(ctx context.Context, p int) (*partIndex, error) {
	x := &partIndex{lanes: map[string]*laneIndex{}}
	first, last, err := s.bounds(ctx, s.shared, p)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) {
		return x, nil // nothing spilled yet
	}
	if err != nil {
		return nil, err
	}
	cur, err := s.cursors(ctx, map[string][]int{s.shared: {p}})
	if err != nil {
		return nil, err
	}
	x.floor = first
	switch c, ok := cur[topicPart{s.shared, p}]; {
	case ok && c >= first && c <= last:
		x.floor = c
	case ok && c < first:
		s.lost(s.shared, p, c, first)
	}
	x.end = x.floor
	cursors, err := s.readCursors(ctx, p)
	if err != nil {
		return nil, err
	}
	for t, c := range cursors {
		if c > last {
			// Past the end: the spill topic was deleted and made again.
			// Such a cursor would hide the lane's new records.
			s.log.Warn("kafka: spill cursor past the end of its partition; ignored", "topic", s.shared, "partition", p, "cursor", c, "end", last)
			continue
		}
		x.lanes[t] = &laneIndex{cursor: c, saved: true}
	}
	if err := s.scanShared(ctx, p, x, last); err != nil {
		return nil, err
	}
	return x, nil
}

// scanShared indexes the group's records of spill partition p from x.end
// up to to, and moves x.end there. It decodes only the headers that name a
// record's group and tenant.
func (s *SpillLog) scanShared(ctx context.Context, p int, x *partIndex, to int64) error {
	o := wire.FetchOptions{MaxBytes: s.cfg.fetchBytes, MaxWait: fetchSlack}
	for stalls := 0; x.end < to && stalls < fetchStalls; {
		before := x.end
		next, _, err := s.records.Fetch(ctx, s.shared, int32(p), x.end, o, func(r *wire.Record, hs []wire.Header) error {
			if r.Offset >= to {
				return wire.ErrStop
			}
			if tenant, ok := s.laneOf(hs); ok {
				x.add(tenant, r.Offset)
			} else {
				s.stats.skipped.Add(1)
			}
			return nil
		})
		switch {
		case errors.Is(err, kafkago.OffsetOutOfRange):
			first, _, berr := s.bounds(ctx, s.shared, p)
			if berr != nil {
				return berr
			}
			if first <= x.end {
				return fmt.Errorf("kafka: scan spill %s/%d at %d: %w", s.shared, p, x.end, err)
			}
			s.lost(s.shared, p, x.end, first)
			x.floor, x.end = first, first
			continue
		case err != nil:
			return fmt.Errorf("kafka: scan spill %s/%d at %d: %w", s.shared, p, x.end, err)
		}
		x.end = max(x.end, next)
		if x.end == before {
			stalls++
		} else {
			stalls = 0
		}
	}
	return nil
}

// laneOf returns the tenant of a record of the shared topic when it is a
// spill record of this log's group and source.
func (s *SpillLog) laneOf(hs []wire.Header) (string, bool) {
	if len(hs) == 0 || string(hs[len(hs)-1].Key) != SpillHeaderCount {
		return "", false
	}
	// The original's headers come first (SpillHeaderCount of them) and may
	// have any name: only the ones after them are the log's.
	n, err := strconv.Atoi(string(hs[len(hs)-1].Value))
	if err != nil || n < 0 || n > len(hs)-1 {
		return "", false
	}
	var group, tenant, source []byte
	haveTenant := false
	for i := n; i < len(hs)-1; i++ {
		switch string(hs[i].Key) {
		case SpillHeaderGroup:
			group = hs[i].Value
		case SpillHeaderTenant:
			tenant, haveTenant = hs[i].Value, true
		case SpillHeaderSource:
			source = hs[i].Value
		}
	}
	if !haveTenant || string(group) != s.group || string(source) != s.source {
		return "", false
	}
	return string(tenant), true
}

// catchUp indexes what other processes (or other groups) appended to spill
// partition p since the index's end.
func (s *SpillLog) catchUp(ctx context.Context, p int, sp *sharedPart) error {
	sp.mu.Lock()
	x := sp.idx
	var from int64
	if x != nil {
		from = x.end
	}
	sp.mu.Unlock()
	if x == nil {
		return nil
	}
	_, last, err := s.bounds(ctx, s.shared, p)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) {
		return nil
	}
	if err != nil || last <= from {
		return err
	}
	// Scan into a scratch index over the same cursors, then merge what lies
	// at or past the live index's end (an Append may have moved it).
	scratch := &partIndex{floor: from, end: from, lanes: map[string]*laneIndex{}}
	if err := s.scanShared(ctx, p, scratch, last); err != nil {
		return err
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.idx != x || scratch.floor != from {
		return nil // rebuilt meanwhile, or records were lost: the next build sees them
	}
	type rec struct {
		tenant string
		off    int64
	}
	var recs []rec
	for t, l := range scratch.lanes {
		for _, o := range l.offs {
			if o >= x.end {
				recs = append(recs, rec{t, o})
			}
		}
	}
	slices.SortFunc(recs, func(a, b rec) int { return int(a.off - b.off) })
	for _, r := range recs {
		x.add(r.tenant, r.off)
	}
	x.end = max(x.end, scratch.end)
	return nil
}

// readShared is Read on the shared topic: the positions come from the
// index, and each fetch starts at the next wanted position, so a lane's
// read fetches only the record batches that hold its records (an Append
// batch holds the records of the lanes whose appends were sent together:
// each batch is fetched at most once per lane it holds and Read window).
// The lane's records a fetch brings beyond limit (up to limit more) are
// kept for the next Read (SpillReadAhead).
func (s *SpillLog) readShared(ctx context.Context, lane consumer.SpillLane, from int64, limit int) ([]*consumer.Message, error) {
	p := int(lane.Partition.ID)
	sp, err := s.index(ctx, p)
	if err != nil {
		return nil, err
	}
	if from >= 0 {
		if out, _, ok := s.ahead.take(lane, from, limit); ok && len(out) > 0 {
			s.stats.aheadHits.Add(1)
			s.stats.read.Add(uint64(len(out)))
			return out, nil
		}
	}
	// Up to limit more of the lane's records are decoded when a fetch made
	// for the first limit brings them, and kept for the next Read.
	want := s.wanted(sp, lane.Tenant, from, 2*limit)
	if len(want) == 0 {
		if err := s.catchUp(ctx, p, sp); err != nil {
			return nil, err
		}
		if want = s.wanted(sp, lane.Tenant, from, 2*limit); len(want) == 0 {
			return nil, nil
		}
	}
	var out, extra []*consumer.Message
	for stalls := 0; len(want) > 0 && len(out) < limit && stalls < fetchStalls; {
		at := want[0]
		o := wire.FetchOptions{MaxBytes: s.fetchSize(limit - len(out)), MaxWait: fetchSlack}
		next, _, err := s.records.Fetch(ctx, s.shared, int32(p), at, o, func(r *wire.Record, hs []wire.Header) error {
			for len(want) > 0 && want[0] < r.Offset {
				want = want[1:] // gone (not expected: the topic is append-only)
			}
			if len(want) == 0 {
				return wire.ErrStop
			}
			if r.Offset != want[0] {
				return nil
			}
			want = want[1:]
			f := fetchedOf(r, hs)
			s.noteRecord(f)
			rec, ok := decodeSpill(f, s.source)
			if !ok || rec.group != s.group || !rec.named || rec.tenant != lane.Tenant {
				s.stats.skipped.Add(1)
				return nil
			}
			if len(out) < limit {
				out = append(out, rec.msg)
			} else {
				extra = append(extra, rec.msg)
			}
			return nil
		})
		switch {
		case errors.Is(err, kafkago.OffsetOutOfRange):
			first, _, berr := s.bounds(ctx, s.shared, p)
			if berr != nil {
				return nil, berr
			}
			if first <= at {
				return nil, fmt.Errorf("kafka: read spill %s/%d at %d: %w", s.shared, p, at, err)
			}
			s.lost(s.shared, p, at, first)
			for len(want) > 0 && want[0] < first {
				want = want[1:]
			}
			continue
		case err != nil:
			return nil, fmt.Errorf("kafka: read spill %s/%d at %d: %w", s.shared, p, at, err)
		}
		if next <= at && len(want) > 0 && want[0] == at {
			stalls++
		} else {
			stalls = 0
		}
	}
	if len(out) > 0 && len(extra) > 0 {
		s.ahead.put(lane, out[len(out)-1].SpillPos+1, extra, extra[len(extra)-1].SpillPos+1)
	}
	s.stats.read.Add(uint64(len(out)))
	return out, nil
}

func (s *SpillLog) wanted(sp *sharedPart, tenant string, from int64, limit int) []int64 {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.idx == nil {
		return nil
	}
	return sp.idx.wanted(tenant, from, limit)
}

// commitShared moves lane's cursor: a record keyed by the lane in the
// cursor topic, then, when the partition's lowest unsettled record moved,
// the floor (the cursor group's offset on the spill partition).
func (s *SpillLog) commitShared(ctx context.Context, lane consumer.SpillLane, next int64) error {
	p := int(lane.Partition.ID)
	sp, err := s.index(ctx, p)
	if err != nil {
		return err
	}
	if _, err := s.cursorTopic(ctx); err != nil {
		return err
	}
	rec := kafkago.Record{Time: time.Now(), Key: kafkago.NewBytes(cursorKey(s.group, p, lane.Tenant)), Value: kafkago.NewBytes([]byte(strconv.FormatInt(next, 10)))}
	if _, err := produceBatch(ctx, s.client, s.cursorLog, p, []kafkago.Record{rec}); err != nil {
		if cacheMiss(err) || errors.Is(err, kafkago.UnknownTopicOrPartition) {
			// Made elsewhere, deleted, or short of a partition the source
			// grew: look again (and grow it) on the next call.
			s.sources.Forget(s.source, nil)
			s.topics.Forget(s.cursorLog, nil)
		}
		return fmt.Errorf("kafka: spill cursor of %q on %s/%d: %w", lane.Tenant, s.cursorLog, p, err)
	}
	s.stats.commits.Add(1)
	sp.mu.Lock()
	var floor int64 = -1
	if x := sp.idx; x != nil {
		x.settle(lane.Tenant, next)
		if floor = x.raise(); floor >= 0 {
			x.prune()
		}
	}
	sp.mu.Unlock()
	s.commitFloor(ctx, p, floor)
	return nil
}

// raise moves the floor up to the oldest unsettled record and returns it,
// or -1 when it did not move.
func (x *partIndex) raise() int64 {
	low := x.lowest()
	if low <= x.floor {
		return -1
	}
	x.floor = low
	return low
}

// prune forgets the lanes with nothing past the floor, so that memory
// holds only lanes with unsettled records or a cursor past the floor.
// Their cursor records, if any, are read again and dropped by the next
// Pending.
func (x *partIndex) prune() {
	for t, l := range x.lanes {
		if len(l.offs) == 0 && l.cursor <= x.floor {
			delete(x.lanes, t)
		}
	}
}

// commitFloor commits floor (if >= 0) as the cursor group's offset on
// spill partition p. Best effort: a floor that lags costs only a longer
// scan when the partition is next assigned.
func (s *SpillLog) commitFloor(ctx context.Context, p int, floor int64) {
	if floor < 0 {
		return
	}
	if err := commitOffsets(ctx, s.client, s.cursor, s.shared, map[int]int64{p: floor}); err != nil {
		s.log.Warn("kafka: moving a spill floor failed", "topic", s.shared, "partition", p, "err", err)
	}
}

// dropCursors moves the floor of p up to its oldest unsettled record and
// removes (tombstones) the cursor records of the lanes of p whose cursor
// is at or below it: the floor says as much. Called by Pending, before the
// engine makes any other call for p's lanes.
func (s *SpillLog) dropCursors(ctx context.Context, p int, sp *sharedPart) {
	sp.mu.Lock()
	var drop []string
	floor := int64(-1)
	if x := sp.idx; x != nil {
		// A partition whose oldest unsettled record lies past the floor
		// (records of other groups, or settled ones the floor never
		// passed) gets its floor moved, so the next build starts there.
		floor = x.raise()
		for t, l := range x.lanes {
			if l.saved && l.cursor <= x.floor {
				drop = append(drop, t)
			}
		}
	}
	sp.mu.Unlock()
	s.commitFloor(ctx, p, floor)
	if len(drop) == 0 {
		return
	}
	recs := make([]kafkago.Record, len(drop))
	now := time.Now()
	for i, t := range drop {
		recs[i] = kafkago.Record{Time: now, Key: kafkago.NewBytes(cursorKey(s.group, p, t))}
	}
	if _, err := produceBatch(ctx, s.client, s.cursorLog, p, recs); err != nil {
		s.log.Warn("kafka: dropping settled spill cursors failed", "topic", s.cursorLog, "partition", p, "err", err)
		return
	}
	sp.mu.Lock()
	if x := sp.idx; x != nil {
		for _, t := range drop {
			if l := x.lanes[t]; l != nil && l.cursor <= x.floor {
				l.saved = false
				if len(l.offs) == 0 {
					delete(x.lanes, t)
				}
			}
		}
	}
	sp.mu.Unlock()
}

// cursorKey is the key of a lane's record in the cursor topic:
// "<group token>/<partition>/<tenant>" (a token has no '/').
func cursorKey(group string, p int, tenant string) []byte {
	return []byte(dlq.TenantToken(group) + "/" + strconv.Itoa(p) + "/" + tenant)
}

// readCursors returns the cursors of this group's lanes of partition p
// kept in the cursor topic.
func (s *SpillLog) readCursors(ctx context.Context, p int) (map[string]int64, error) {
	out := map[string]int64{}
	first, last, err := s.bounds(ctx, s.cursorLog, p)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	prefix := dlq.TenantToken(s.group) + "/" + strconv.Itoa(p) + "/"
	o := wire.FetchOptions{MaxBytes: s.cfg.fetchBytes, MaxWait: fetchSlack}
	err = readRange(ctx, s.records, s.cursorLog, p, first, last, o, func(f *fetched) error {
		switch tenant, next, ok := parseCursor(prefix, f.key, f.value); {
		case !ok:
		case next < 0:
			delete(out, tenant)
		default:
			out[tenant] = next
		}
		return nil
	})
	return out, err
}

// parseCursor decodes a record of the cursor topic: the tenant of a lane
// whose key starts with prefix (its group and partition), and its cursor,
// or -1 for a tombstone. ok is false for any other record (another group's
// or partition's, or not a cursor).
func parseCursor(prefix string, key, value []byte) (tenant string, next int64, ok bool) {
	tenant, ok = strings.CutPrefix(string(key), prefix)
	if !ok {
		return "", 0, false
	}
	if value == nil {
		return tenant, -1, true
	}
	n, err := strconv.ParseInt(string(value), 10, 64)
	if err != nil || n < 0 {
		return "", 0, false
	}
	return tenant, n, true
}

// appendReq is one Append waiting for its partition's flush.
type appendReq struct {
	tenant string
	recs   []spillRec
	err    error
	done   chan struct{}
}

// appendShared queues msgs for spill partition p and waits for the flush
// that sends them. Appends of several lanes of one partition that wait at
// once go out together, in as few produce requests as the topic's limit
// allows; each Append's records stay in order and contiguous.
func (s *SpillLog) appendShared(ctx context.Context, lane consumer.SpillLane, msgs []*consumer.Message) error {
	req := &appendReq{tenant: lane.Tenant, recs: make([]spillRec, len(msgs)), done: make(chan struct{})}
	for i, m := range msgs {
		req.recs[i] = encodeSpill(m, s.group, lane.Tenant, true)
	}
	p := int(lane.Partition.ID)
	sp := s.part(p)
	sp.mu.Lock()
	sp.queue = append(sp.queue, req)
	start := !sp.busy
	sp.busy = true
	sp.mu.Unlock()
	if start {
		go s.flush(p, sp)
	}
	select {
	case <-req.done:
		return req.err
	case <-ctx.Done():
		// The flush may still send the records: as a whole, so what landed
		// is a prefix of msgs, as Append allows.
		return ctx.Err()
	}
}

// flush sends partition p's queued appends until the queue is empty.
func (s *SpillLog) flush(p int, sp *sharedPart) {
	for {
		sp.mu.Lock()
		reqs := sp.queue
		sp.queue = nil
		if len(reqs) == 0 {
			sp.busy = false
			sp.mu.Unlock()
			return
		}
		sp.mu.Unlock()
		if len(reqs) > 1 {
			s.stats.coalesced.Add(uint64(len(reqs)))
		}
		s.send(p, sp, reqs)
	}
}

// send produces reqs to spill partition p in order, and ends each of them.
func (s *SpillLog) send(p int, sp *sharedPart, reqs []*appendReq) {
	type item struct {
		req int
		rec *spillRec
	}
	var items []item
	for i, r := range reqs {
		for j := range r.recs {
			items = append(items, item{i, &r.recs[j]})
		}
	}
	done := 0 // reqs ended
	end := func(upto int, err error) {
		for ; done < upto; done++ {
			reqs[done].err = err
			close(reqs[done].done)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), produceTimeout)
	defer cancel()
	now := time.Now()
	retried := false
	for start := 0; start < len(items); {
		t, err := s.topic(ctx, s.shared, p)
		if err != nil {
			end(len(reqs), err)
			return
		}
		size := batchOverhead
		stop := start
		for i := start; i < len(items); i++ {
			n := recordSizeAt(items[i].rec.body, i-start)
			if size+n > t.limit {
				break
			}
			size += n
			stop = i + 1
		}
		if stop == start {
			need := batchOverhead + recordSizeAt(items[start].rec.body, 0)
			if need > maxTopicLimit {
				end(len(reqs), fmt.Errorf("kafka: spill record for %s is %d bytes, more than a produce request may carry (%d): %w", s.shared, need, maxTopicLimit, dlq.ErrUnwritable))
				return
			}
			if err := s.raise(ctx, s.shared, t, need); err != nil {
				end(len(reqs), err)
				return
			}
			continue
		}
		batch := make([]kafkago.Record, stop-start)
		for i, it := range items[start:stop] {
			batch[i] = kafkago.Record{Time: now, Key: kafkago.NewBytes(it.rec.key), Value: kafkago.NewBytes(it.rec.value), Headers: it.rec.headers}
		}
		base, err := produceBatch(ctx, s.client, s.shared, p, batch)
		if err != nil {
			if tooLarge(err) && !retried {
				retried = true
				s.topics.Forget(s.shared, nil)
				continue
			}
			if cacheMiss(err) || errors.Is(err, kafkago.UnknownTopicOrPartition) {
				s.topics.Forget(s.shared, nil)
			}
			end(len(reqs), fmt.Errorf("kafka: spill to %s/%d: %w", s.shared, p, err))
			return
		}
		s.stats.produces.Add(1)
		s.stats.appended.Add(uint64(stop - start))
		s.stats.appendedBytes.Add(uint64(size))
		sp.mu.Lock()
		if x := sp.idx; x != nil && x.end == base {
			for i, it := range items[start:stop] {
				x.add(reqs[it.req].tenant, base+int64(i))
			}
			x.end = base + int64(stop-start)
		}
		sp.mu.Unlock()
		start = stop
		// The appends whose records all went out are done.
		upto := len(reqs)
		if start < len(items) {
			upto = items[start].req
		}
		end(upto, nil)
	}
}

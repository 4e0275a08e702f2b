package console

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringfence/ringfence/consumer"
)

// snapshot is one reading of the engine, shared by every viewer until it
// is Refresh old.
type snapshot struct {
	seq   uint64
	at    time.Time
	ref   *engineRef      // the engine it was read from; nil: none
	stats *consumer.Stats // nil: no engine
	line  StatsLine
	json  []byte // line, encoded once for every viewer
}

// snapshots hands out the current snapshot, reading the engine at most
// once per Refresh whatever the number of viewers. consumer.Stats is called
// with no console lock held: viewers that arrive while it runs wait for its
// result on a channel, not on a lock.
type snapshots struct {
	c   *Console
	cur atomic.Pointer[snapshot]
	seq atomic.Uint64

	mu      sync.Mutex    // guards reading
	reading chan struct{} // closed when the read in progress is stored; nil: none
}

// get returns a snapshot no older than Refresh (a fresh one is read if
// needed), or the last one if ctx ends while waiting for a read.
func (s *snapshots) get(ctx context.Context) *snapshot {
	ref := s.c.engine.Load()
	if cur := s.cur.Load(); cur != nil && cur.ref == ref && s.c.o.Now().Sub(cur.at) < s.c.o.Refresh {
		return cur
	}
	s.mu.Lock()
	wait := s.reading
	if wait == nil {
		s.reading = make(chan struct{})
	}
	s.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
		}
		if cur := s.cur.Load(); cur != nil {
			return cur
		}
		return s.read(nil)
	}
	snap := s.read(ref)
	s.cur.Store(snap)
	s.mu.Lock()
	close(s.reading)
	s.reading = nil
	s.mu.Unlock()
	return snap
}

// read takes a snapshot of ref's engine.
func (s *snapshots) read(ref *engineRef) *snapshot {
	snap := &snapshot{seq: s.seq.Add(1), ref: ref}
	label := ""
	if ref != nil {
		st := ref.e.Stats()
		snap.stats, label = &st, ref.label
	}
	snap.at = s.c.o.Now()
	snap.line = statsLineOf(snap.seq, snap.at, label, snap.stats)
	b, err := json.Marshal(snap.line)
	if err != nil {
		b = []byte(`{"type":"error","command":"stats","error":"encoding failed"}`)
	}
	snap.json = b
	return snap
}

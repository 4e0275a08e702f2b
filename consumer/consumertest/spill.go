package consumertest

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/ringfence/ringfence/consumer"
)

// ErrSpillDown is returned by a Spill that was set down.
var ErrSpillDown = errors.New("consumertest: spill log is down")

// Spill is an in-memory consumer.SpillLog: one ordered log per lane with a
// committed cursor, kept across engine runs (like a broker's), that can be
// taken down or made to fail an append halfway. Safe for concurrent use.
type Spill struct {
	mu       sync.Mutex
	logs     map[consumer.SpillLane]*memLog
	down     bool
	tornNext bool // the next Append stores half its batch, then fails
	fails    int
	appended int
}

type memLog struct {
	base    int64 // position of entries[0]
	entries []memEntry
	cursor  int64 // committed: entries below are removed
}

// memEntry is a stored message and its spill note.
type memEntry struct {
	msg  consumer.Message
	note []byte
}

// NewSpill returns an empty, working spill log.
func NewSpill() *Spill { return &Spill{logs: make(map[consumer.SpillLane]*memLog)} }

// SetDown makes every call fail (true) or work (false).
func (s *Spill) SetDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

// TearNextAppend makes the next Append store the first half of its batch
// and then fail, as a broker that acknowledged some records and lost the
// connection would: the engine appends them all again (duplicates).
func (s *Spill) TearNextAppend() {
	s.mu.Lock()
	s.tornNext = true
	s.mu.Unlock()
}

// Failures counts refused calls.
func (s *Spill) Failures() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fails
}

// Appended counts messages stored (duplicates included).
func (s *Spill) Appended() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.appended
}

// Backlog counts entries not yet committed, across lanes.
func (s *Spill) Backlog() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.logs {
		n += len(l.entries)
	}
	return n
}

func (s *Spill) log(lane consumer.SpillLane) *memLog {
	l := s.logs[lane]
	if l == nil {
		l = &memLog{}
		s.logs[lane] = l
	}
	return l
}

// Append implements consumer.SpillLog.
func (s *Spill) Append(ctx context.Context, lane consumer.SpillLane, msgs []*consumer.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		s.fails++
		return ErrSpillDown
	}
	n := len(msgs)
	torn := s.tornNext && n > 0
	if torn {
		s.tornNext = false
		n = (n + 1) / 2
	}
	l := s.log(lane)
	for _, m := range msgs[:n] {
		l.entries = append(l.entries, memEntry{
			msg: consumer.Message{
				Key: m.Key, Value: m.Value, Headers: slices.Clone(m.Headers), Topic: m.Topic,
				Partition: m.Partition, Offset: m.Offset, Stream: m.Stream, Time: m.Time,
			},
			note: slices.Clone(m.SpillNote()),
		})
		s.appended++
	}
	if torn {
		s.fails++
		return ErrSpillDown
	}
	return nil
}

// Read implements consumer.SpillLog.
func (s *Spill) Read(ctx context.Context, lane consumer.SpillLane, from int64, limit int) ([]*consumer.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		s.fails++
		return nil, ErrSpillDown
	}
	l := s.log(lane)
	if from < 0 {
		from = l.cursor
	}
	from = max(from, l.base)
	var out []*consumer.Message
	for pos := from; pos < l.base+int64(len(l.entries)) && len(out) < limit; pos++ {
		e := &l.entries[pos-l.base]
		m := e.msg
		m.Refed, m.SpillPos = true, pos
		m.SetSpillNote(e.note)
		out = append(out, &m)
	}
	return out, nil
}

// Commit implements consumer.SpillLog.
func (s *Spill) Commit(ctx context.Context, lane consumer.SpillLane, next int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		s.fails++
		return ErrSpillDown
	}
	l := s.log(lane)
	if next <= l.cursor {
		return nil
	}
	l.cursor = next
	if drop := min(next-l.base, int64(len(l.entries))); drop > 0 {
		l.entries = slices.Delete(l.entries, 0, int(drop))
		l.base += drop
	}
	return nil
}

// Pending implements consumer.SpillLog.
func (s *Spill) Pending(ctx context.Context, p consumer.Partition) ([]consumer.SpillLane, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		s.fails++
		return nil, ErrSpillDown
	}
	var out []consumer.SpillLane
	for lane, l := range s.logs {
		if lane.Partition == p && len(l.entries) > 0 {
			out = append(out, lane)
		}
	}
	return out, nil
}

var _ consumer.SpillLog = (*Spill)(nil)

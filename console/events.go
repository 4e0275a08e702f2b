package console

import (
	"sync"
	"time"

	"github.com/ringfence/ringfence/consumer"
)

// eventLog keeps the last n engine events in a ring. add is called on the
// engine's goroutines, so it only copies the event under a leaf lock; the
// conversion to JSON happens when someone reads.
type eventLog struct {
	mu   sync.Mutex    // guards ring and next
	ring []storedEvent // ring[seq % len(ring)] holds event seq
	next uint64        // seq of the next event; the first is 1
}

type storedEvent struct {
	seq uint64
	at  time.Time
	e   consumer.Event
}

func (l *eventLog) init(n int) {
	l.ring = make([]storedEvent, n)
	l.next = 1
}

func (l *eventLog) add(at time.Time, e consumer.Event) {
	l.mu.Lock()
	l.ring[l.next%uint64(len(l.ring))] = storedEvent{seq: l.next, at: at, e: e}
	l.next++
	l.mu.Unlock()
}

// since returns the kept events after seq, oldest first, at most max (the
// newest ones), and the seq of the last event there is.
func (l *eventLog) since(seq uint64, max int) ([]EventLine, uint64) {
	l.mu.Lock()
	last := l.next - 1
	first := seq + 1
	if n := uint64(len(l.ring)); last >= n && first <= last-n {
		first = last - n + 1
	}
	if max > 0 && last >= uint64(max) && first+uint64(max) <= last {
		first = last - uint64(max) + 1
	}
	if first == 0 {
		first = 1
	}
	var got []storedEvent
	for s := first; s <= last; s++ {
		got = append(got, l.ring[s%uint64(len(l.ring))])
	}
	l.mu.Unlock()
	out := make([]EventLine, 0, len(got))
	for i := range got {
		out = append(out, eventLineOf(got[i].seq, got[i].at, &got[i].e))
	}
	return out, last
}

// last returns the seq of the newest event (0: none yet).
func (l *eventLog) last() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next - 1
}

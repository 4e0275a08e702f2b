package console

import (
	"sync"
	"time"

	"github.com/ringfence/ringfence/consumer"
)

// Runs (see the package documentation, # Events): a tenant whose breaker
// is open is probed every few seconds, and each probe is a parked/resumed
// pair; kept one line each, a long outage would push everything else out
// of the log. Other tenants' events do not break a run because tenants
// that fail together interleave their probes and would never collapse.
const (
	// collapseWindow bounds how far back an event looks for its run: the
	// work under the log's lock per event.
	collapseWindow = 16
	// collapseGap: two outages further apart than this stay two lines.
	collapseGap = time.Minute
)

// runClass groups the kinds that collapse into one run; 0: never
// collapses.
func runClass(k consumer.EventKind) uint8 {
	switch k {
	case consumer.EventParked, consumer.EventResumed:
		return 1
	case consumer.EventSpilling, consumer.EventSpillDrained:
		return 2
	case consumer.EventPaused, consumer.EventResumedPartition:
		return 3
	case consumer.EventDeadLettered:
		return 4
	case consumer.EventDLQFailed:
		return 5
	case consumer.EventSpillFailed:
		return 6
	case consumer.EventPanicked:
		return 7
	case consumer.EventReordered:
		return 8
	}
	return 0
}

// eventLog keeps the last n lines of engine events in a ring. add is
// called on the engine's goroutines, so it only copies the event under a
// leaf lock (and looks back over at most collapseWindow lines); the
// conversion to JSON happens when someone reads.
type eventLog struct {
	mu   sync.Mutex    // guards ring, size and next
	ring []storedEvent // lines, oldest first from ring[(end-size) mod n]; seqs increase
	end  int           // index after the newest line
	size int           // lines kept
	next uint64        // seq of the next line or update; the first is 1
}

// storedEvent is one line: an event, or a run of them.
type storedEvent struct {
	seq         uint64 // of its last update
	run         uint64 // seq it was first stored under
	first, last time.Time
	count       int
	kinds       [3]consumer.EventKind // in the order first seen; 0: unused
	e           consumer.Event        // the newest
}

func (l *eventLog) init(n int) {
	l.ring = make([]storedEvent, n)
	l.next = 1
}

// at returns the i-th newest line (0: the newest).
func (l *eventLog) at(i int) *storedEvent {
	n := len(l.ring)
	return &l.ring[((l.end-1-i)%n+n)%n]
}

func sameSubject(a, b *consumer.Event) bool {
	if a.Tenant != "" || a.NoTenant || b.Tenant != "" || b.NoTenant {
		return a.Tenant == b.Tenant && a.NoTenant == b.NoTenant
	}
	return a.Partition == b.Partition
}

func (l *eventLog) add(at time.Time, e consumer.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	seq := l.next
	l.next++
	if cls := runClass(e.Kind); cls != 0 {
		for i := range min(l.size, collapseWindow) {
			s := l.at(i)
			if !sameSubject(&s.e, &e) {
				continue
			}
			if runClass(s.e.Kind) != cls || s.e.Reason != e.Reason || at.Sub(s.last) > collapseGap {
				break
			}
			joined := *s
			joined.seq, joined.last, joined.e = seq, at, e
			joined.count++
			joined.addKind(e.Kind)
			// Move it to the newest place: the i newer lines shift back
			// one.
			for j := i; j > 0; j-- {
				*l.at(j) = *l.at(j - 1)
			}
			*l.at(0) = joined
			return
		}
	}
	l.ring[l.end] = storedEvent{seq: seq, run: seq, first: at, last: at, count: 1, kinds: [3]consumer.EventKind{e.Kind}, e: e}
	l.end = (l.end + 1) % len(l.ring)
	l.size = min(l.size+1, len(l.ring))
}

func (s *storedEvent) addKind(k consumer.EventKind) {
	for i, have := range s.kinds {
		switch have {
		case k:
			return
		case 0:
			s.kinds[i] = k
			return
		}
	}
}

// since returns the lines updated after seq, oldest first, at most max
// (the newest ones; 0: all kept), and the seq of the last update there is.
func (l *eventLog) since(seq uint64, max int) ([]EventLine, uint64) {
	l.mu.Lock()
	last := l.next - 1
	n := 0
	for n < l.size && l.at(n).seq > seq && (max <= 0 || n < max) {
		n++
	}
	got := make([]storedEvent, n)
	for i := range n {
		got[n-1-i] = *l.at(i)
	}
	l.mu.Unlock()
	out := make([]EventLine, 0, len(got))
	for i := range got {
		out = append(out, eventLineOf(&got[i]))
	}
	return out, last
}

// last returns the seq of the newest line or update (0: none yet).
func (l *eventLog) last() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next - 1
}

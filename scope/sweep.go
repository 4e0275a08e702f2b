package scope

import (
	"math"

	"github.com/ringfence/ringfence/policy"
)

// stepSlots is the least number of table slots one inserting lookup scans
// when it helps a sweep. A step scans max(stepSlots, 4n/MaxKeys) slots of a
// table of n, so a sweep's scan is spread over at most MaxKeys/4 inserts, as
// many as make the next sweep due: no single lookup pays for a sweep,
// sweeping keeps up with any insert rate, and steps stay small (on the
// default table, 16 slots) so that they do not make the tail.
const stepSlots = 16

// A scan step finds cold keys in bursts (the slots of one step may hold
// several, or none); they wait in a queue, and a step evicts one of them,
// plus one for each further stepBacklog waiting, so that no lookup pays for
// a burst. Inserts and evictions balance in steady state, so the queue stays
// short; a sweep ends once its scan is done and its queue empty.
const stepBacklog = 8

// sweep is the state of an incremental sweep. All fields are protected by
// sweepMu.
type sweep[K comparable] struct {
	prev  uint32      // epoch before the sweep: entries stamped prev or later were seen
	pos   int         // next slot to scan
	seen  int         // seen entries kept so far
	kept  int         // entries kept so far
	cold  []victim[K] // found cold, not yet evicted: cold[head:] wait
	head  int
	force []*entry[K]     // protected beyond the ceiling: evicted even if pinned
	keys  []K             // evicted keys, for OnEvict
	gone  []*policy.Guard // guards of evicted keys, to retire
	// self is the entry that the lookup doing this step inserted (see
	// help), or nil.
	self *entry[K]
}

// victim is an entry a sweep found cold. An entry found unseen (recheck)
// that a lookup stamps before its turn to leave is kept after all, as a
// seen key; one found beyond the MaxKeys seen keys is not.
type victim[K comparable] struct {
	e       *entry[K]
	recheck bool
}

// help does a step of sweep work if no other goroutine is doing one. If
// wait is set (the scope is at its hard bound) it waits for sweepMu and
// runs a whole sweep instead. self is the entry the calling lookup just
// inserted, or nil: the step keeps it, as it keeps an entry still being
// built, so that the guard the lookup returns is its key's.
func (s *Scope[K]) help(wait bool, self *entry[K]) {
	if wait {
		s.sweepMu.Lock()
		if !s.sweeping.Load() {
			s.start(true)
		}
		evicted := s.work(math.MaxInt, false)
		s.sweepMu.Unlock()
		s.notify(evicted)
		return
	}
	if !s.sweepMu.TryLock() {
		return
	}
	if !s.sweeping.Load() {
		s.start(false)
	}
	var evicted []K
	if s.sweeping.Load() {
		// Scan more per step in a table grown for protected keys, so that
		// a sweep still ends within the inserts that make the next one due.
		s.sw.self = self
		evicted = s.work(max(stepSlots, 4*len(s.tab.Load().slots)/s.maxKeys), true)
		s.sw.self = nil
	}
	s.sweepMu.Unlock()
	s.notify(evicted)
}

func (s *Scope[K]) notify(evicted []K) {
	if s.opts.OnEvict == nil {
		return
	}
	for _, k := range evicted {
		s.opts.OnEvict(k)
	}
}

// start begins a sweep if one is due (or force): lookups from now on stamp
// a new epoch, so keys seen while this sweep runs survive the next one too.
// The caller holds sweepMu.
func (s *Scope[K]) start(force bool) {
	s.mu.Lock()
	due := force || int(s.size.Load()) > s.trigger
	s.mu.Unlock()
	if !due {
		return
	}
	sw := &s.sw
	sw.pos, sw.seen, sw.kept = 0, 0, 0
	sw.prev = s.epoch.Load()
	s.epoch.Store(sw.prev + 1)
	s.sweeping.Store(true)
}

// work scans up to budget slots of the running sweep, evicts the cold
// entries found so far (only a few of them if step, see stepBacklog), and
// finishes the sweep once the table is scanned and no cold entry waits. An
// entry found unseen that was looked up since, or whose breaker opened
// since, is kept after all. It returns the keys evicted (if OnEvict is set).
// The caller holds sweepMu.
func (s *Scope[K]) work(budget int, step bool) []K {
	sw := &s.sw
	t := s.tab.Load()
	end := min(len(t.slots), sw.pos+min(budget, len(t.slots)))
	for ; sw.pos < end; sw.pos++ {
		if e := t.slots[sw.pos].Load(); e != nil {
			s.classify(e)
		}
	}
	// A table grown since the sweep started is scanned from the same
	// position: some entries are classified twice or not at all, which only
	// makes the sweep more approximate.
	scanned := sw.pos >= len(s.tab.Load().slots)
	n := len(sw.cold) - sw.head
	if step {
		n = min(n, 1+n/(stepBacklog+1)) // 1 up to stepBacklog waiting, then 2...
	}
	done := scanned && sw.head+n == len(sw.cold)
	if n > 0 || len(sw.force) > 0 || done {
		s.mu.Lock()
		for _, e := range sw.force {
			s.evictLocked(e, true)
		}
		for _, v := range sw.cold[sw.head : sw.head+n] {
			if v.recheck && v.e.seen.Load() == sw.prev+1 && sw.seen < s.maxKeys {
				sw.seen++ // looked up since it was found cold
				sw.kept++
				continue
			}
			if g := v.e.guard(); g != nil && !g.Closed() && sw.kept < s.ceiling {
				sw.kept++ // its breaker opened since it was found cold
				continue
			}
			s.evictLocked(v.e, false)
		}
		if done {
			// Leave room for MaxKeys/4 new keys before the next sweep, so
			// that sweeping stays amortised.
			n := int(s.size.Load())
			s.trigger = min(max(s.maxKeys, n+s.maxKeys/4+1), s.bound-1)
		}
		s.mu.Unlock()
		for _, g := range sw.gone {
			s.recycler.Retire(g)
		}
		clear(sw.gone)
		sw.gone = sw.gone[:0]
		clear(sw.cold[sw.head : sw.head+n]) // drop references to evicted entries
		sw.head += n
		if sw.head == len(sw.cold) {
			sw.cold, sw.head = sw.cold[:0], 0
		}
		clear(sw.force)
		sw.force = sw.force[:0]
	}
	var evicted []K
	if len(sw.keys) > 0 {
		evicted = sw.keys
		sw.keys = nil
	}
	if done {
		s.sweeping.Store(false)
		s.sweeps.Add(1)
	}
	return evicted
}

// classify decides whether e survives the running sweep: seen keys up to
// MaxKeys, and pinned keys while fewer than HardCeiling keys are kept. It
// reads only the entry's own line: a key whose breaker is not closed is
// kept when its turn to leave comes (work checks its breaker then), so the
// scan does not read the guard state of every key it passes, a cache miss
// each.
func (s *Scope[K]) classify(e *entry[K]) {
	sw := &s.sw
	st := e.state.Load()
	switch {
	case st < 0:
		return
	case st&builtBit == 0 || e == sw.self: // still being built, or just built: brand new
		sw.seen++
		sw.kept++
	case st&pinMask > 0:
		if sw.kept < s.ceiling {
			sw.kept++
		} else {
			sw.force = append(sw.force, e)
		}
	case e.seen.Load()-sw.prev <= 1: // stamped prev or prev+1
		if sw.seen < s.maxKeys {
			sw.seen++
			sw.kept++
		} else {
			sw.cold = append(sw.cold, victim[K]{e: e})
		}
	default:
		sw.cold = append(sw.cold, victim[K]{e: e, recheck: true})
	}
}

// evictLocked evicts e (only if unpinned, unless force) and removes it from
// the table. The caller holds mu.
func (s *Scope[K]) evictLocked(e *entry[K], force bool) {
	for {
		n := e.state.Load()
		pins := n & pinMask
		if n < 0 || (pins > 0 && !force) {
			return // gone already, or pinned since it was classified
		}
		// Dead, its pins dropped; still built, for a lookup that found it
		// just before.
		if e.state.CompareAndSwap(n, n&builtBit|deadBit) {
			if pins > 0 {
				s.pinned.Add(-1)
			}
			break
		}
	}
	s.removeLocked(e)
	s.evictions.Add(1)
	if g := e.guard(); g != nil {
		s.sw.gone = append(s.sw.gone, g)
	}
	if s.opts.OnEvict != nil {
		s.sw.keys = append(s.sw.keys, e.key)
	}
}

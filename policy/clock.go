package policy

import (
	"sync/atomic"
	"time"
)

// Clock supplies the current time. Implementations must be safe for
// concurrent use. Tests use a fake clock so that breaker timing needs no
// sleep.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// The coarse clock times attempts for the slow-call check when Policy.Clock
// is the system clock. Every attempt through a breaker must be checked, and
// reading time.Now at its start and end costs more than the rest of a
// closed-breaker success together (BenchmarkSuccess: ringfence-timed against
// ringfence); one atomic load of a value a ticker refreshes every coarseTick
// is plenty for a threshold of at least 100ms (Breaker.SlowCall.Floor).
//
// The value is nanoseconds since coarseBase with its low bit telling its
// state: odd while the ticker refreshes it every coarseTick (fresh: at most a
// tick and some scheduling delay old), even while the ticker is idle (no
// attempt read the clock for coarseIdleAfter; then it ticks once every
// coarseIdleTick). An attempt that starts on an idle clock reads the exact
// clock instead (and wakes the ticker), so no attempt starts on a stale
// value. One that ends on an idle clock (it ran longer than coarseIdleAfter
// with no other attempt in the process) is measured up to coarseIdleTick
// short.
//
// The ticker's goroutine is started at package init and waits, blocked on a
// channel without a timer, until the first attempt needs the clock: a
// goroutine started lazily by that attempt would belong to the
// testing/synctest bubble the attempt may run in, which could then never
// end. The coarse clock is therefore real time even inside a bubble: to test
// slow calls under synctest, inject a Clock (then every attempt is timed with
// Clock.Now, exactly).
const (
	coarseTick      = 5 * time.Millisecond
	coarseIdleTick  = time.Second
	coarseIdleAfter = 10 * time.Second
)

var coarse struct {
	_    cacheLinePad
	now  atomic.Int64 // ns since coarseBase; odd: fresh, even: idle
	used atomic.Bool  // read since the ticker last looked
	_    cacheLinePad
}

var (
	coarseBase = time.Now()
	coarseWake = make(chan struct{}, 1)
)

func init() { go coarseTicker() }

// coarseNow returns the coarse time and whether it is fresh. Reading marks
// the clock as used, with a store only when the mark is not set already, so
// that readers on many cores rarely write the shared line.
func coarseNow() (int64, bool) {
	v := coarse.now.Load()
	if !coarse.used.Load() {
		coarse.used.Store(true)
	}
	if v&1 == 0 {
		select {
		case coarseWake <- struct{}{}:
		default:
		}
		return v, false
	}
	return v, true
}

func coarseTicker() {
	<-coarseWake // until the first attempt needs the clock
	t := time.NewTicker(coarseTick)
	fast, idle := true, time.Duration(0)
	for {
		if fast {
			coarse.now.Store(int64(time.Since(coarseBase)) | 1)
		} else {
			coarse.now.Store(int64(time.Since(coarseBase)) &^ 1)
		}
		select {
		case <-t.C:
		case <-coarseWake:
		}
		switch {
		case coarse.used.Load():
			coarse.used.Store(false)
			idle = 0
			if !fast {
				fast = true
				t.Reset(coarseTick)
			}
		case fast:
			if idle += coarseTick; idle >= coarseIdleAfter {
				fast = false
				t.Reset(coarseIdleTick)
			}
		}
	}
}

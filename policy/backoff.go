package policy

import (
	"math/rand/v2"
	"time"
)

// Backoff returns the wait after the given failed attempt (from 1). prev is
// the previous wait, used by decorrelated jitter (0 before the first retry).
// It spends nothing.
func (h *Guard) Backoff(attempt int, err error, prev time.Duration) time.Duration {
	return h.r.backoffFor(attempt, err, prev)
}

// MaxAttempts returns the resolved maximum number of attempts.
func (h *Guard) MaxAttempts() int { return h.r.maxAttempts }

// backoffFor is the wait after the given failed attempt (from 1). prev is
// the previous wait, used by decorrelated jitter (0 before the first retry).
func (r *resolved) backoffFor(attempt int, err error, prev time.Duration) time.Duration {
	b := r.backoff
	var d time.Duration
	switch b.Kind {
	case Constant:
		d = b.Base
	case Linear:
		d = b.Base * time.Duration(attempt)
		if attempt > 0 && d/time.Duration(attempt) != b.Base { // overflow
			d = b.Max
		}
	case CustomKind:
		d = b.Custom(attempt, err)
	default:
		// Decorrelated jitter: uniform in [Base, 3*prev], capped.
		if prev < b.Base {
			prev = b.Base
		}
		hi := b.Max // 3*prev, capped, without overflow
		if p := min(prev, b.Max); p <= b.Max/3 {
			hi = p * 3
		}
		d = b.Base
		if hi > b.Base {
			d += time.Duration(rand.Int64N(int64(hi - b.Base + 1)))
		}
	}
	return min(max(d, 0), b.Max)
}

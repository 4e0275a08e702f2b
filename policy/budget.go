package policy

// The retry budget: a token bucket per guard kept as the amount spent, in
// thousandths of a token, so that earning and spending are one CAS each; and
// a floor of retries per second for a guard with too little traffic to earn
// any, kept as a virtual schedule under mu.

// earn deposits a success's share into the retry budget. It reads before it
// writes so that a full bucket (the steady state) costs no contended write.
func (g *guard) earn() {
	if !g.r.budget {
		return
	}
	for {
		t := g.spent.Load()
		if t <= 0 {
			return
		}
		if g.spent.CompareAndSwap(t, max(t-g.r.earnMilli, 0)) {
			return
		}
	}
}

// spend withdraws one token for a retry, from the bucket or else from the
// floor. It reports whether the retry may go ahead.
func (g *guard) spend() bool {
	if !g.r.budget {
		return true
	}
	for {
		t := g.spent.Load()
		if g.r.maxMilli-t < 1000 {
			break
		}
		if g.spent.CompareAndSwap(t, t+1000) {
			return true
		}
	}
	if g.r.floorPerSec == 0 {
		return false
	}
	// The floor is a virtual schedule in integer ns, so it neither drifts
	// nor loses fractions however often it is asked.
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	empty := max(g.floorEmpty, now-g.r.floorCap)
	if now-empty < g.r.floorEvery {
		return false
	}
	g.floorEmpty = empty + g.r.floorEvery
	return true
}

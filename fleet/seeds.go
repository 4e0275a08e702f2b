package fleet

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// This file is the agent's breaker view of the fleet: the other processes'
// statuses, the seeds it gives the engine (SetBreakerSeeds) and, with a
// BreakerQuorum, the breakers it trips (TripBreakers).

// peer is another process's last status.
type peer struct {
	s Status
	// gone: the process deleted its status while it was live (Close): it
	// left, and its open breakers still seed until their RetryAt.
	gone bool
}

// openUntil returns t's open-until if the status reports t's breaker open
// until after now.
func openUntil(t TenantStatus, now time.Time) (time.Time, bool) {
	return t.RetryAt, t.State == policy.Open.String() && t.RetryAt.After(now)
}

// holdsSeeds reports whether p reports any breaker open until after now.
func (p *peer) holdsSeeds(now time.Time) bool {
	for _, t := range p.s.Tenants {
		if _, ok := openUntil(t, now); ok {
			return true
		}
	}
	return false
}

// seedState is the agent's table of other processes' statuses; owned by
// the goroutine that loads or watches them (Start, then seedLoop).
type seedState struct {
	self    string // this process's key: its own status is skipped
	peers   map[string]*peer
	dropped uint64 // statuses ignored past MaxProcesses
	dirty   bool   // changed since the seeds were last computed
	// seen is the keys the watch being loaded has sent (nil once loaded):
	// a live peer it did not send left while no watch ran.
	seen map[string]bool
}

// applyStatus folds one update of the status table into st.
func (a *Agent) applyStatus(st *seedState, u Update) {
	switch {
	case u.Key == st.self:
	case u.Value == nil:
		a.depart(st, u.Key)
	default:
		s, err := DecodeStatus(u.Value)
		if err != nil {
			a.log.Warn("fleet: skipping a status record that does not decode", "key", u.Key, "err", err)
			a.note(func(st *AgentStats) { st.Skipped++ })
			return
		}
		if st.seen != nil {
			st.seen[u.Key] = true
		}
		if _, known := st.peers[u.Key]; !known && len(st.peers) >= a.cfg.MaxProcesses {
			st.dropped++
			return
		}
		st.peers[u.Key] = &peer{s: s} // an expired one is swept at the next tick
		st.dirty = true
	}
}

// depart handles the deletion of key's status. A process that deletes its
// own status while live (Close) leaves the group: the dependency it found
// down is no less down, so its open breakers keep seeding until their
// RetryAt (the next owner of its partitions starts their tenants open). A
// status deleted once expired (swept) is dropped.
func (a *Agent) depart(st *seedState, key string) {
	p := st.peers[key]
	if p == nil || p.gone {
		return
	}
	now := a.cfg.Now()
	if !p.s.Expired(now) && p.holdsSeeds(now) {
		p.gone = true
	} else {
		delete(st.peers, key)
	}
	st.dirty = true
}

// loadStatuses reads a new status watch up to Loaded into st.
func (a *Agent) loadStatuses(ctx context.Context, ch <-chan Update, st *seedState) error {
	st.seen = map[string]bool{}
	defer func() { st.seen = nil }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case u, ok := <-ch:
			switch {
			case !ok:
				return cmp.Or(ctx.Err(), errors.New("fleet: the status watch ended"))
			case u.Err != nil:
				return u.Err
			case u.Loaded:
				for k, p := range st.peers {
					if !p.gone && !st.seen[k] {
						a.depart(st, k)
					}
				}
				return nil
			default:
				a.applyStatus(st, u)
			}
		}
	}
}

// refresh drops what st holds past its time, and returns the statuses of
// dead processes to sweep (at most maxSweep). If st changed, it gives the
// engine the seeds; with a BreakerQuorum, it trips the breakers a quorum
// of live processes report open (every time: a tenant may have come back
// to the engine with the guard it had).
func (a *Agent) refresh(st *seedState) (dead []string) {
	now := a.cfg.Now()
	live := 0
	for k, p := range st.peers {
		switch {
		case p.gone:
			if !p.holdsSeeds(now) {
				delete(st.peers, k)
				st.dirty = true
			}
		case p.s.Expired(now):
			delete(st.peers, k)
			st.dirty = true
			if len(dead) < maxSweep {
				dead = append(dead, k)
			}
		default:
			live++
		}
	}
	var quorum map[string]time.Time
	if a.cfg.BreakerQuorum > 0 {
		quorum = quorumTrips(st.peers, now, a.cfg.BreakerQuorum)
	}
	tripped := 0
	if len(quorum) > 0 {
		tripped = a.c.TripBreakers(quorum)
	}
	seeds := -1
	if st.dirty {
		st.dirty = false
		m := map[string]time.Time{}
		for _, p := range st.peers {
			for _, t := range p.s.Tenants {
				if until, ok := openUntil(t, now); ok && until.After(m[t.Tenant]) {
					m[t.Tenant] = until
				}
			}
		}
		a.c.SetBreakerSeeds(m)
		seeds = len(m)
	}
	departed, dropped := len(st.peers)-live, st.dropped
	a.note(func(s *AgentStats) {
		s.Processes, s.Departed, s.ProcessesDropped = live, departed, dropped
		if seeds >= 0 {
			s.Seeds = seeds
		}
		s.Quorum = len(quorum)
		s.QuorumTrips += uint64(tripped)
	})
	return dead
}

// quorumTrips returns, for each tenant whose breaker at least q live
// processes report open, the time until which at least q of them do: the
// q-th latest of their open-until times.
func quorumTrips(peers map[string]*peer, now time.Time, q int) map[string]time.Time {
	reports := map[string][]time.Time{}
	for _, p := range peers {
		if p.gone || p.s.Expired(now) {
			continue
		}
		for _, t := range p.s.Tenants {
			if until, ok := openUntil(t, now); ok {
				reports[t.Tenant] = append(reports[t.Tenant], until)
			}
		}
	}
	out := map[string]time.Time{}
	for tenant, us := range reports {
		if len(us) < q {
			continue
		}
		slices.SortFunc(us, func(x, y time.Time) int { return y.Compare(x) })
		out[tenant] = us[q-1]
	}
	return out
}

// seedLoop follows the status table (ch, loaded by Start, then new
// watches after one ends), and refreshes the engine's view at most once
// per Interval.
func (a *Agent) seedLoop(ctx context.Context, ch <-chan Update, st *seedState) {
	backoff := rewatchBackoff
	for {
		a.followStatuses(ctx, ch, st)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, maxRewatchBackoff)
			var err error
			if ch, err = a.st.Watch(ctx, KindStatus); err == nil {
				if err = a.loadStatuses(ctx, ch, st); err == nil {
					break
				}
			}
			if ctx.Err() != nil {
				return
			}
			a.fail(err, true)
		}
		backoff = rewatchBackoff
	}
}

// followStatuses applies ch's updates until the watch ends, refreshing
// the engine's view every Interval.
func (a *Agent) followStatuses(ctx context.Context, ch <-chan Update, st *seedState) {
	tick := time.NewTicker(a.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-ch:
			switch {
			case !ok:
				return
			case u.Err != nil:
				a.log.Warn("fleet: status watch ended; starting it again", "err", u.Err)
				a.fail(u.Err, true)
				return
			case u.Loaded:
			default:
				a.applyStatus(st, u)
			}
		case <-tick.C:
			a.sweep(ctx, a.refresh(st))
		}
	}
}

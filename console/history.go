package console

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/policy"
)

// history keeps, for at most HistoryTenants tenants (those worth
// watching), the last HistoryPoints samples of their goodput and time lag,
// taken every HistoryEvery from the shared snapshot. Its memory is
// HistoryTenants rings of HistoryPoints samples whatever the number of
// tenants: no per-tenant state is kept for the others.
type history struct {
	mu      sync.Mutex // guards everything below (leaf lock; the engine is read before it is taken)
	max     int        // HistoryTenants
	points  int        // HistoryPoints
	ref     *engineRef // the engine sampled; another one starts over
	lastSeq uint64     // the snapshot sampled last
	last    time.Time  // when
	tracked []*tenantHistory
	spare   []*tenantHistory // rings of tenants no longer watched, reused

	running bool // the sampler goroutine runs
}

// tenantHistory is one watched tenant's ring of samples.
type tenantHistory struct {
	key     string // raw key; "" for the no-tenant bucket
	trouble bool   // at the last sample
	handled uint64 // at the last sample: goodput is its difference
	at      time.Time
	ring    []sample // ring[(next-n+i) mod len] is the i-th oldest
	next, n int
}

// sample is one point of a tenant's plots.
type sample struct {
	at      time.Time
	goodput float64 // handled per second since the previous sample
	lag     float64 // time lag, seconds
}

func (h *tenantHistory) reset(key string) {
	h.key, h.trouble, h.handled, h.at, h.next, h.n = key, false, 0, time.Time{}, 0, 0
}

func (h *tenantHistory) push(s sample) {
	h.ring[h.next] = s
	h.next = (h.next + 1) % len(h.ring)
	h.n = min(h.n+1, len(h.ring))
}

// samples returns the ring oldest first.
func (h *tenantHistory) samples() []sample {
	out := make([]sample, h.n)
	for i := range h.n {
		out[i] = h.ring[(h.next-h.n+i+len(h.ring))%len(h.ring)]
	}
	return out
}

func tenantKey(t *consumer.TenantStats) string {
	if t.NoTenant {
		return ""
	}
	return t.Tenant
}

func troubled(t *consumer.TenantStats) bool {
	return t.State != policy.Closed || t.Parked > 0 || t.Spilling > 0
}

// watchRank orders tenants by how much they are worth watching: in
// trouble first, then the largest backlog, then the most handled.
func watchRank(a, b *consumer.TenantStats) int {
	if ta, tb := troubled(a), troubled(b); ta != tb {
		if ta {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(b.Queued, a.Queued); c != 0 {
		return c
	}
	return cmp.Compare(b.Handled, a.Handled)
}

// add samples snap. A watched tenant keeps its ring while the engine lists
// it, until a tenant in trouble needs its place and it is not in trouble
// itself; free places go to the tenants most worth watching (watchRank).
func (h *history) add(snap *snapshot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if snap.ref != h.ref || snap.stats == nil {
		h.ref = snap.ref
		h.spare = append(h.spare, h.tracked...)
		h.tracked = h.tracked[:0]
	}
	if snap.stats == nil || snap.seq == h.lastSeq {
		return
	}
	h.lastSeq, h.last = snap.seq, snap.at

	byKey := make(map[string]*tenantHistory, len(h.tracked))
	for _, th := range h.tracked {
		byKey[th.key] = th
	}
	seen := make(map[*tenantHistory]bool, len(h.tracked))
	var cands []*consumer.TenantStats // the best h.max untracked ones, in watchRank order
	for i := range snap.stats.Tenants {
		t := &snap.stats.Tenants[i]
		if th := byKey[tenantKey(t)]; th != nil {
			seen[th] = true
			h.record(th, t, snap.at)
			continue
		}
		if len(cands) == h.max && watchRank(t, cands[len(cands)-1]) >= 0 {
			continue
		}
		at, _ := slices.BinarySearchFunc(cands, t, func(c, t *consumer.TenantStats) int {
			if watchRank(c, t) <= 0 {
				return -1
			}
			return 1
		})
		cands = slices.Insert(cands, at, t)
		if len(cands) > h.max {
			cands = cands[:h.max]
		}
	}
	// Tenants the engine no longer lists (forgotten when idle) lose their
	// ring.
	h.tracked = slices.DeleteFunc(h.tracked, func(th *tenantHistory) bool {
		if !seen[th] {
			h.spare = append(h.spare, th)
			return true
		}
		return false
	})
	for _, t := range cands {
		if len(h.tracked) >= h.max {
			if !troubled(t) {
				break
			}
			// The calm tenant that handled least gives its place.
			victim := -1
			for i, th := range h.tracked {
				if !th.trouble && (victim < 0 || th.handled < h.tracked[victim].handled) {
					victim = i
				}
			}
			if victim < 0 {
				break
			}
			h.spare = append(h.spare, h.tracked[victim])
			h.tracked = slices.Delete(h.tracked, victim, victim+1)
		}
		th := h.ring()
		th.reset(tenantKey(t))
		h.record(th, t, snap.at)
		h.tracked = append(h.tracked, th)
	}
}

// ring returns a spare ring, or a new one.
func (h *history) ring() *tenantHistory {
	if n := len(h.spare); n > 0 {
		th := h.spare[n-1]
		h.spare = h.spare[:n-1]
		return th
	}
	return &tenantHistory{ring: make([]sample, h.points)}
}

// record adds t's sample at to th: its goodput since th's previous sample
// (none for the first, or when its counter went back: it was forgotten and
// came back).
func (h *history) record(th *tenantHistory, t *consumer.TenantStats, at time.Time) {
	if !th.at.IsZero() && at.After(th.at) && t.Handled >= th.handled {
		th.push(sample{
			at:      at,
			goodput: float64(t.Handled-th.handled) / at.Sub(th.at).Seconds(),
			lag:     timeLagOf(t).Seconds(),
		})
	}
	th.key, th.trouble, th.handled, th.at = tenantKey(t), troubled(t), t.Handled, at
}

// watched returns a copy of the watched tenants' samples, by key.
func (h *history) watched() (map[string][]sample, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string][]sample, len(h.tracked))
	for _, th := range h.tracked {
		out[th.key] = th.samples()
	}
	return out, h.last
}

// startSampling starts the sampler unless it runs: while an engine is
// attached and until Close, it samples the shared snapshot every
// HistoryEvery.
func (c *Console) startSampling() {
	c.hist.mu.Lock()
	defer c.hist.mu.Unlock()
	if c.hist.running {
		return
	}
	select {
	case <-c.done:
		return
	default:
	}
	c.hist.running = true
	go c.sampleLoop()
}

func (c *Console) sampleLoop() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(c.o.HistoryEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			c.stopSampling()
			return
		case <-tick.C:
		}
		if c.engine.Load() == nil && c.stopSampling() {
			return
		}
		c.sample(ctx)
	}
}

// stopSampling marks the sampler stopped unless an engine was attached
// meanwhile (then it goes on and reports false).
func (c *Console) stopSampling() bool {
	c.hist.mu.Lock()
	defer c.hist.mu.Unlock()
	if c.engine.Load() != nil && ctxAlive(c.done) {
		return false
	}
	c.hist.running = false
	return true
}

func ctxAlive(done chan struct{}) bool {
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// sample takes one sample for the plots (from the shared snapshot: a
// viewer's fresh one is reused).
func (c *Console) sample(ctx context.Context) {
	if c.engine.Load() == nil {
		return
	}
	c.hist.add(c.snaps.get(ctx))
}

package fleet

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/policy"
)

// Agent defaults and bounds.
const (
	// DefaultInterval is how often an agent publishes its status.
	DefaultInterval = time.Second
	// DefaultLagThreshold is the commit lag (offsets) past which a tenant
	// counts as not healthy.
	DefaultLagThreshold = 10_000
	// DefaultMaxProcesses bounds the other processes' statuses an agent
	// keeps for breaker seeds; statuses past it are ignored (counted in
	// AgentStats.ProcessesDropped).
	DefaultMaxProcesses = 1024
	// DefaultMaxControls bounds the controlled tenants an agent applies;
	// records of more tenants are ignored (counted in
	// AgentStats.ControlsDropped).
	DefaultMaxControls = 65536
	// maxSweep bounds the statuses of dead processes an agent deletes per
	// Interval (a crashed process leaves its last status on a Kafka
	// compacted topic; NATS KV removes it by MaxAge).
	maxSweep = 16
	// callTimeout bounds each store call of the agent.
	callTimeout = 5 * time.Second
	// rewatchBackoff is the first wait before an ended watch is started
	// again; it doubles up to maxRewatchBackoff.
	rewatchBackoff    = 100 * time.Millisecond
	maxRewatchBackoff = 5 * time.Second
)

// AgentConfig configures NewAgent. Zero values mean the documented
// defaults.
type AgentConfig struct {
	// Consumer is the engine the agent reports on and applies controls to.
	// Required.
	Consumer *consumer.Consumer
	// Store is where the group's tables live. Required.
	Store Store
	// Group names the fleet (shown in statuses).
	Group string
	// Source names the source kind shown ("kafka", "nats", ...).
	Source string
	// Process identifies this process. Default: "host/pid/random".
	Process string
	// Interval is how often the status is published. Default
	// DefaultInterval.
	Interval time.Duration
	// TTL is how long the status stays valid without a new one. Default
	// DefaultTTL; at least 2 Intervals.
	TTL time.Duration
	// MaxTenants bounds the tenants a status lists. Default
	// DefaultMaxTenants.
	MaxTenants int
	// LagThreshold: a tenant whose commit lag is over it is not healthy.
	// Default DefaultLagThreshold.
	LagThreshold int64
	// MaxProcesses bounds the statuses kept for breaker seeds, of live
	// processes and of those that left and still seed (Departed). Default
	// DefaultMaxProcesses.
	MaxProcesses int
	// MaxControls bounds the control table. Default DefaultMaxControls.
	MaxControls int
	// BreakerQuorum, if not 0, trips a tenant's breaker in this process,
	// even one that exists and is closed, when at least BreakerQuorum
	// other live processes report it open (Consumer.TripBreakers), until
	// the latest time at least BreakerQuorum of them report it open until
	// (the BreakerQuorum-th latest of their open-until times). For a
	// tenant several processes handle at once (a header tenant over many
	// partitions). At least 2: one process alone never trips the others.
	// Default 0: off (seeds apply only to new guards).
	BreakerQuorum int
	// Logger receives one line per skipped record and per failed call.
	// Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// AgentStats is a snapshot of an agent.
type AgentStats struct {
	Process string
	// LastPublish is when the last status was written, Published how many
	// were, PublishErrors how many writes failed.
	LastPublish   time.Time
	Published     uint64
	PublishErrors uint64
	// LastControl is when the control table was last applied (SetControls),
	// Controls how many active controls it held, ControlsApplied how many
	// times it was applied.
	LastControl     time.Time
	Controls        int
	ControlsApplied uint64
	// Skipped counts records that did not decode (each logged once);
	// ControlsDropped records of tenants past MaxControls.
	Skipped, ControlsDropped uint64
	// WatchErrors counts watches that ended with an error (each started
	// again after a backoff); LastError is the last error of any kind.
	WatchErrors uint64
	LastError   string
	// Processes is how many other live processes' statuses are kept,
	// ProcessesDropped how many statuses were ignored past MaxProcesses;
	// Seeds how many tenants the last SetBreakerSeeds named; Departed
	// how many processes that left (Close) still seed their open breakers
	// until their RetryAt.
	Processes, Seeds, Departed int
	ProcessesDropped           uint64
	// Quorum is how many tenants a BreakerQuorum of live processes
	// reported open at the last look; QuorumTrips how many breakers of
	// this engine were opened (or kept open longer) for it.
	Quorum      int
	QuorumTrips uint64
	// Swept counts the statuses of dead processes this agent deleted.
	Swept uint64
}

// Agent runs beside a consumer.Consumer: it publishes the process's status
// every Interval, applies the group's control table with SetControls as
// it changes, and gives the engine the fleet's breaker view with
// SetBreakerSeeds. Its methods are safe for concurrent use.
type Agent struct {
	cfg  AgentConfig
	c    *consumer.Consumer
	st   Store
	log  *slog.Logger
	stop context.CancelFunc
	done sync.WaitGroup

	mu    sync.Mutex // guards stats; never held over a store or engine call
	stats AgentStats
}

// NewAgent checks cfg and returns an agent; Start starts it.
func NewAgent(cfg AgentConfig) (*Agent, error) {
	switch {
	case cfg.Consumer == nil:
		return nil, errors.New("fleet: AgentConfig.Consumer is required")
	case cfg.Store == nil:
		return nil, errors.New("fleet: AgentConfig.Store is required")
	case cfg.Interval < 0 || cfg.TTL < 0 || cfg.MaxTenants < 0 || cfg.LagThreshold < 0 || cfg.MaxProcesses < 0 || cfg.MaxControls < 0:
		return nil, errors.New("fleet: AgentConfig: negative interval, TTL or bound")
	case cfg.BreakerQuorum < 0 || cfg.BreakerQuorum == 1:
		return nil, fmt.Errorf("fleet: AgentConfig.BreakerQuorum %d: want 0 (off) or at least 2 (one process alone never trips the others' breakers)", cfg.BreakerQuorum)
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < 2*cfg.Interval {
		return nil, fmt.Errorf("fleet: AgentConfig.TTL %v is under 2 Intervals (%v)", cfg.TTL, cfg.Interval)
	}
	if cfg.MaxTenants == 0 {
		cfg.MaxTenants = DefaultMaxTenants
	}
	if cfg.LagThreshold == 0 {
		cfg.LagThreshold = DefaultLagThreshold
	}
	if cfg.MaxProcesses == 0 {
		cfg.MaxProcesses = DefaultMaxProcesses
	}
	if cfg.MaxControls == 0 {
		cfg.MaxControls = DefaultMaxControls
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Process == "" {
		cfg.Process = DefaultProcess()
	}
	a := &Agent{cfg: cfg, c: cfg.Consumer, st: cfg.Store, log: logger(cfg.Logger)}
	a.stats.Process = cfg.Process
	return a, nil
}

// DefaultProcess returns "host/pid/random": unique per process start.
func DefaultProcess() string {
	host, _ := os.Hostname()
	var b [3]byte
	_, _ = rand.Read(b[:])
	return host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(b[:])
}

// Start loads the group's control table and applies it to the consumer,
// and the other processes' statuses and gives the consumer their breaker
// seeds, then starts the agent's loops and returns: call it before the
// consumer's Run, so that no message is handled before the controls and
// seeds hold (a partition assigned at once starts its tenants' breakers as
// the fleet knows them). It fails when ctx ends first or a table cannot be
// read. Cancelling
// ctx later stops the agent as a crash would (its status ages out after
// TTL); Close stops it and removes its status.
func (a *Agent) Start(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	ch, err := a.st.Watch(ctx, KindControl)
	if err != nil {
		cancel()
		return err
	}
	table := map[string]ControlRecord{}
	if err := a.loadInto(ctx, ch, table); err != nil {
		cancel()
		return err
	}
	a.setControls(table)
	sch, err := a.st.Watch(ctx, KindStatus)
	if err != nil {
		cancel()
		return err
	}
	seeds := &seedState{self: Key(a.cfg.Process), peers: map[string]*peer{}}
	if err := a.loadStatuses(ctx, sch, seeds); err != nil {
		cancel()
		return fmt.Errorf("fleet: loading the status table: %w", err)
	}
	seeds.dirty = true
	a.sweep(ctx, a.refresh(seeds))
	a.stop = cancel
	a.done.Add(3)
	go func() { defer a.done.Done(); a.controlLoop(ctx, ch, table) }()
	go func() { defer a.done.Done(); a.statusLoop(ctx) }()
	go func() { defer a.done.Done(); a.seedLoop(ctx, sch, seeds) }()
	return nil
}

// Close stops the agent and deletes its status (a goodbye, so that the
// process leaves the fleet's view at once). It waits for the loops.
func (a *Agent) Close() error {
	if a.stop == nil {
		return nil
	}
	a.stop()
	a.done.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return a.st.Delete(ctx, KindStatus, Key(a.cfg.Process))
}

// Stats returns a snapshot of the agent.
func (a *Agent) Stats() AgentStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

func (a *Agent) note(f func(s *AgentStats)) {
	a.mu.Lock()
	f(&a.stats)
	a.mu.Unlock()
}

func (a *Agent) fail(err error, watch bool) {
	a.note(func(s *AgentStats) {
		s.LastError = err.Error()
		if watch {
			s.WatchErrors++
		}
	})
}

// apply folds one update into the control table (keyed by record key,
// which decodeControlAt checks is the tenant's).
func (a *Agent) apply(table map[string]ControlRecord, u Update) {
	if u.Value == nil {
		delete(table, u.Key)
		return
	}
	r, ok := decodeControlAt(u.Key, u.Value, a.log)
	if !ok {
		a.note(func(s *AgentStats) { s.Skipped++ })
		return
	}
	if _, known := table[u.Key]; !known && len(table) >= a.cfg.MaxControls {
		a.note(func(s *AgentStats) { s.ControlsDropped++ })
		return
	}
	table[u.Key] = r
}

func (a *Agent) setControls(table map[string]ControlRecord) {
	m := make(map[string]consumer.Control, len(table))
	for _, r := range table {
		if r.Active() {
			m[r.Tenant] = r.Engine()
		}
	}
	a.c.SetControls(m)
	now := a.cfg.Now()
	a.note(func(s *AgentStats) {
		s.LastControl, s.Controls = now, len(m)
		s.ControlsApplied++
	})
}

// controlLoop applies every change of the control table, batching the
// updates already queued. An ended watch is started again after a backoff;
// its full table replaces the old one.
func (a *Agent) controlLoop(ctx context.Context, ch <-chan Update, table map[string]ControlRecord) {
	for {
		err := a.follow(ctx, ch, table)
		if ctx.Err() != nil {
			return
		}
		a.log.Warn("fleet: control watch ended; starting it again", "err", err)
		a.fail(err, true)
		for backoff := rewatchBackoff; ; backoff = min(2*backoff, maxRewatchBackoff) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			if ch, err = a.st.Watch(ctx, KindControl); err == nil {
				next := map[string]ControlRecord{}
				if err = a.loadInto(ctx, ch, next); err == nil {
					table = next
					a.setControls(table)
					break
				}
			}
			if ctx.Err() != nil {
				return
			}
			a.fail(err, true)
		}
	}
}

// follow applies ch's updates to table until the watch ends.
func (a *Agent) follow(ctx context.Context, ch <-chan Update, table map[string]ControlRecord) error {
	for {
		var u Update
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case u, ok = <-ch:
		}
		changed := false
	batch:
		for {
			switch {
			case !ok:
				err := cmp.Or(ctx.Err(), errors.New("fleet: the control watch ended"))
				if changed {
					a.setControls(table)
				}
				return err
			case u.Err != nil:
				if changed {
					a.setControls(table)
				}
				return u.Err
			case !u.Loaded:
				a.apply(table, u)
				changed = true
			}
			select {
			case u, ok = <-ch:
			default:
				break batch
			}
		}
		if changed {
			a.setControls(table)
		}
	}
}

// loadInto reads a new watch up to Loaded into table.
func (a *Agent) loadInto(ctx context.Context, ch <-chan Update, table map[string]ControlRecord) error {
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("fleet: loading the control table: %w", ctx.Err())
		case u, ok := <-ch:
			switch {
			case !ok:
				return fmt.Errorf("fleet: loading the control table: %w", cmp.Or(ctx.Err(), errors.New("watch ended")))
			case u.Err != nil:
				return u.Err
			case u.Loaded:
				return nil
			default:
				a.apply(table, u)
			}
		}
	}
}

// statusLoop publishes the status every Interval.
func (a *Agent) statusLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.Interval)
	defer t.Stop()
	for {
		a.publish(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (a *Agent) publish(ctx context.Context) {
	s := a.Status()
	cctx, cancel := context.WithTimeout(ctx, min(callTimeout, a.cfg.TTL))
	err := PublishStatus(cctx, a.st, s)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		a.log.Warn("fleet: publishing the status failed", "err", err)
		a.note(func(st *AgentStats) { st.PublishErrors++; st.LastError = err.Error() })
		return
	}
	a.note(func(st *AgentStats) { st.LastPublish = s.UpdatedAt; st.Published++ })
}

// Status builds the process's status from the engine's Stats now.
func (a *Agent) Status() Status {
	now := a.cfg.Now()
	es := a.c.Stats()
	s := Status{
		V: Version, Process: a.cfg.Process, Group: a.cfg.Group, Source: a.cfg.Source,
		UpdatedAt: now, TTL: a.cfg.TTL,
		Counts: Counts{
			Tenants: len(es.Tenants), Controlled: es.Controlled,
			Handled: es.Handled, Failed: es.Failed, DeadLettered: es.DeadLettered,
			Parked: es.Parked, Queued: es.Queued, InFlight: es.InFlight,
		},
	}
	for _, p := range es.Partitions {
		s.Partitions = append(s.Partitions, fmt.Sprintf("%s/%d", p.Partition.Topic, p.Partition.ID))
	}
	sc := a.c.Scope()
	var bad []TenantStatus
	for i := range es.Tenants {
		ts := &es.Tenants[i]
		if ts.State == policy.Closed && ts.Parked == 0 && ts.Spilling == 0 && !ts.Held && ts.Control == nil &&
			!ts.DLQUnavailable && ts.CommitLag <= a.cfg.LagThreshold {
			continue
		}
		t := TenantStatus{
			Tenant: ts.Tenant, State: ts.State.String(), Parked: ts.Parked, Spilling: ts.Spilling,
			Lag: ts.CommitLag, OldestAge: ts.TimeLag, Held: ts.Held, DLQUnavailable: ts.DLQUnavailable,
		}
		if ts.State == policy.Open && sc != nil {
			if g, ok := sc.Peek(ts.Tenant); ok {
				if d := g.RetryAfter(); d > 0 {
					t.RetryAt = now.Add(d)
				}
			}
		}
		if ctl := ts.Control; ctl != nil {
			t.Control = &Control{Hold: ctl.Hold, Quarantine: ctl.Quarantine, Breaker: ctl.Breaker.String(), Weight: ctl.Weight, Concurrency: ctl.Concurrency}
		}
		bad = append(bad, t)
	}
	slices.SortFunc(bad, func(x, y TenantStatus) int {
		return cmp.Or(cmp.Compare(severity(y), severity(x)), cmp.Compare(y.OldestAge, x.OldestAge), cmp.Compare(x.Tenant, y.Tenant))
	})
	s.Counts.Unhealthy = len(bad)
	if len(bad) > a.cfg.MaxTenants {
		s.Counts.Omitted = len(bad) - a.cfg.MaxTenants
		bad = bad[:a.cfg.MaxTenants]
	}
	s.Tenants = bad
	return s
}

// severity orders tenants worst first.
func severity(t TenantStatus) int {
	switch {
	case t.State == policy.Open.String():
		return 6
	case t.DLQUnavailable:
		return 5
	case t.Held:
		return 4
	case t.State == policy.HalfOpen.String():
		return 3
	case t.Spilling > 0 || t.Parked > 0:
		return 2
	case t.Lag > 0:
		return 1
	}
	return 0
}

// sweep deletes the statuses of processes found dead, so that they do
// not pile up on a compacted topic. Several agents may delete the same
// one; a process only slow to heartbeat writes its status again.
func (a *Agent) sweep(ctx context.Context, keys []string) {
	for _, k := range keys {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		err := a.st.Delete(cctx, KindStatus, k)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				a.fail(err, false)
			}
			return
		}
		a.note(func(s *AgentStats) { s.Swept++ })
	}
}

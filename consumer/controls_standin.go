package consumer

// Stand-in for the controls API (see the controls branch): the fleet
// package codes against these declarations until the real ones land. This
// file stores the tables and does nothing else.

import (
	"fmt"
	"sync"
	"time"
)

// Control is an operator's standing instruction for one tenant.
type Control struct {
	Hold        bool
	Quarantine  bool
	Breaker     BreakerOverride
	Weight      int
	Concurrency int
	By, Reason  string
	At          time.Time
}

// BreakerOverride forces a tenant's breaker.
type BreakerOverride uint8

// Breaker overrides.
const (
	BreakerAuto BreakerOverride = iota
	BreakerForceOpen
	BreakerForceClosed
)

func (b BreakerOverride) String() string {
	switch b {
	case BreakerAuto:
		return "auto"
	case BreakerForceOpen:
		return "open"
	case BreakerForceClosed:
		return "closed"
	}
	return fmt.Sprintf("BreakerOverride(%d)", uint8(b))
}

// ParseBreakerOverride parses "auto", "open" or "closed".
func ParseBreakerOverride(s string) (BreakerOverride, error) {
	switch s {
	case "auto", "":
		return BreakerAuto, nil
	case "open":
		return BreakerForceOpen, nil
	case "closed":
		return BreakerForceClosed, nil
	}
	return 0, fmt.Errorf("consumer: unknown breaker override %q", s)
}

type standinTables struct {
	controls map[string]Control
	seeds    map[string]time.Time
}

var standin sync.Map // *Consumer -> *standinTables (under standinMu)
var standinMu sync.Mutex

func (c *Consumer) standin() *standinTables {
	v, _ := standin.LoadOrStore(c, &standinTables{})
	return v.(*standinTables)
}

// SetControls replaces the whole table.
func (c *Consumer) SetControls(m map[string]Control) {
	cp := make(map[string]Control, len(m))
	for k, v := range m {
		cp[k] = v
	}
	standinMu.Lock()
	c.standin().controls = cp
	standinMu.Unlock()
}

// Controls returns a copy of the table.
func (c *Consumer) Controls() map[string]Control {
	standinMu.Lock()
	defer standinMu.Unlock()
	cp := make(map[string]Control, len(c.standin().controls))
	for k, v := range c.standin().controls {
		cp[k] = v
	}
	return cp
}

// SetBreakerSeeds replaces the fleet's view of tenants' breakers.
func (c *Consumer) SetBreakerSeeds(m map[string]time.Time) {
	cp := make(map[string]time.Time, len(m))
	for k, v := range m {
		cp[k] = v
	}
	standinMu.Lock()
	c.standin().seeds = cp
	standinMu.Unlock()
}

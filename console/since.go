package console

import (
	"time"

	"github.com/ringfence/ringfence/consumer"
)

// timeLagOf is how old the tenant's oldest unsettled message is.
func timeLagOf(t *consumer.TenantStats) time.Duration { return t.TimeLag }

// setSince fills the since-when fields of l from t, as of the snapshot's
// time at.
func setSince(l *TenantStats, t *consumer.TenantStats, at time.Time) {
	if !t.OpenSince.IsZero() {
		since := t.OpenSince.UTC()
		l.OpenSince, l.OpenForNS = &since, int64(max(0, at.Sub(t.OpenSince)))
	}
	l.TimeLagNS, l.OldestParkedNS, l.SpillBacklogAgeNS = int64(t.TimeLag), int64(t.OldestParked), int64(t.SpillBacklogAge)
}

package console

import (
	"time"

	"github.com/ringfence/ringfence/consumer"
)

// timeLagOf is how old the tenant's oldest unsettled message is.
func timeLagOf(t *consumer.TenantStats) time.Duration { return 0 }

// setSince fills the since-when fields of l from t, as of the snapshot's
// time at.
func setSince(l *TenantStats, t *consumer.TenantStats, at time.Time) {}

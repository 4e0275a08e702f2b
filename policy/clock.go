package policy

import "time"

// Clock supplies the current time. Implementations must be safe for
// concurrent use. Tests use a fake clock so that breaker timing needs no
// sleep.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

//go:build !unix

package nats

import "time"

func cpuTime() time.Duration { return 0 }

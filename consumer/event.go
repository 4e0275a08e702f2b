package consumer

import (
	"fmt"
	"time"

	"github.com/ringfence/ringfence/dlq"
)

// EventKind says what happened in the engine.
type EventKind uint8

// Event kinds.
const (
	EventParked           EventKind = iota + 1 // a tenant's lane stopped behind its open breaker
	EventResumed                               // a parked lane got a permit again
	EventRetried                               // a message will be retried after Delay
	EventDeadLettered                          // a message's dead letter was written and it was settled
	EventDLQFailed                             // writing a dead letter failed; it stays unsettled and is retried after Delay
	EventPanicked                              // a handler panicked (counted as a failure)
	EventPaused                                // a partition was paused (a bound was reached)
	EventResumedPartition                      // a paused partition was resumed
	EventRevoked                               // a partition was revoked; its queued messages were dropped
	EventReordered                             // a message was handled ahead of its lane's suspect head, as evidence (Reason says of what)
)

func (k EventKind) String() string {
	switch k {
	case EventParked:
		return "parked"
	case EventResumed:
		return "resumed"
	case EventRetried:
		return "retried"
	case EventDeadLettered:
		return "dead-lettered"
	case EventDLQFailed:
		return "dlq-failed"
	case EventPanicked:
		return "panicked"
	case EventPaused:
		return "partition-paused"
	case EventResumedPartition:
		return "partition-resumed"
	case EventRevoked:
		return "partition-revoked"
	case EventReordered:
		return "reordered"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is passed to Config.OnEvent. Fields that do not apply are zero.
type Event struct {
	Kind      EventKind
	Tenant    string
	Partition Partition
	Offset    int64
	Delay     time.Duration
	Reason    dlq.Reason
	Err       error
}

func (c *Consumer) emit(e Event) {
	if c.cfg.OnEvent != nil {
		c.cfg.OnEvent(e)
	}
}

// emitLocked emits while mu is held; hooks must not call back into the
// consumer.
func (c *Consumer) emitLocked(e Event) { c.emit(e) }

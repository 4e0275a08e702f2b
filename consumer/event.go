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
	EventDLQFailed                             // writing a dead letter failed; it stays unsettled and is written again after Delay (at most Config.DLQProbe)
	EventDLQUnwritable                         // the DLQ says the dead letter can never be written; the message is set aside
	EventPanicked                              // a handler panicked (counted as a failure)
	EventPaused                                // a partition was paused (Pause says why)
	EventResumedPartition                      // a paused partition was resumed
	EventAssigned                              // a partition was assigned
	EventRevoked                               // a partition was revoked; its queued messages were dropped
	EventReordered                             // a message was handled ahead of its lane's suspect head, as evidence (Reason says of what)
	EventSpilling                              // a tenant's lane started spilling to its spill log (Spill says why)
	EventSpillDrained                          // a tenant's spill log was read back to its end; its messages flow directly again
	EventSpillFailed                           // appending to or reading a spill log failed; retried after Delay
	EventControlSet                            // SetControls set or changed the tenant's control
	EventControlCleared                        // SetControls cleared the tenant's control
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
	case EventDLQUnwritable:
		return "dlq-unwritable"
	case EventPanicked:
		return "panicked"
	case EventPaused:
		return "partition-paused"
	case EventResumedPartition:
		return "partition-resumed"
	case EventAssigned:
		return "partition-assigned"
	case EventRevoked:
		return "partition-revoked"
	case EventReordered:
		return "reordered"
	case EventSpilling:
		return "spilling"
	case EventSpillDrained:
		return "spill-drained"
	case EventSpillFailed:
		return "spill-failed"
	case EventControlSet:
		return "control-set"
	case EventControlCleared:
		return "control-cleared"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// PauseReason says why the engine paused a partition.
type PauseReason uint8

// Pause reasons.
const (
	// PauseQueueFull: the partition holds MaxQueuedPerPartition messages in
	// memory: no SpillLog, or messages arrive faster than they can be
	// appended to it.
	PauseQueueFull PauseReason = iota + 1
	// PauseParkedBound: a parked tenant reached MaxParkedPerTenant (or all
	// reached MaxParked) and there is no SpillLog to spill it to.
	PauseParkedBound
	// PauseSpillUnavailable: the partition is full of messages waiting for
	// a spill log that fails.
	PauseSpillUnavailable
	// PauseDraining: the engine is shutting down.
	PauseDraining
	// PauseReadAhead: the partition holds ReadAhead messages of quick
	// tenants; it reads on once half of them are handled.
	PauseReadAhead
)

func (r PauseReason) String() string {
	switch r {
	case PauseQueueFull:
		return "queue-full"
	case PauseParkedBound:
		return "parked-bound"
	case PauseSpillUnavailable:
		return "spill-unavailable"
	case PauseDraining:
		return "draining"
	case PauseReadAhead:
		return "read-ahead"
	}
	return ""
}

// Event is passed to Config.OnEvent. Fields that do not apply are zero. The
// tenant of the no-tenant bucket is "" (with NoTenant set).
type Event struct {
	Kind      EventKind
	Tenant    string
	NoTenant  bool
	Partition Partition
	Offset    int64
	Delay     time.Duration
	Reason    dlq.Reason
	Pause     PauseReason
	Spill     SpillReason
	Err       error
}

// emit passes e to OnEvent. Called with no engine lock held.
func (c *Consumer) emit(e Event) {
	if c.cfg.OnEvent != nil {
		c.cfg.OnEvent(e)
	}
}

// Package fleet shows and steers every process of a consumer group from the
// brokers it already runs on: each process's status (what it owns, the
// tenants it finds not healthy) and the group's durable tenant controls
// (hold, quarantine, breaker overrides, weights).
//
// # Tables
//
// A group has two tables, each a Kafka compacted topic
// ("<group>.ringfence-status", "<group>.ringfence-control") or a NATS KV
// bucket ("ringfence-status-<group>" with the status TTL as its MaxAge,
// "ringfence-control-<group>"). Records are versioned JSON keyed by the
// dlq.TenantToken of their process or tenant. A topic or bucket that is not
// marked as ringfence's (HeaderFleet on every record, MetaFleet in the
// bucket's metadata) is refused with ErrNotFleet. A status whose UpdatedAt
// plus TTL is past is dropped on read: a dead process leaves the view
// within its TTL.
//
// # Agent
//
// An Agent runs beside a consumer.Consumer. Start loads the control table
// and applies it with SetControls, and loads the other processes' statuses
// and gives their breaker seeds to SetBreakerSeeds, before it returns, so
// call it before the consumer's Run; the agent then applies every change
// as its watches see it, publishes the status every Interval (bounded to
// MaxTenants tenants, worst first), and refreshes the seeds at most once
// per Interval. It makes no store call under a lock, and a record that
// does not decode is skipped with one log line.
//
// # Breakers across processes
//
// A seed is the latest time until which another process reports a
// tenant's breaker open. It applies only when this engine makes the
// tenant's guard (first sight, or a tenant of a partition just assigned
// whose guard has recorded nothing): the guard starts open until then,
// and the first attempt is a probe at that time. So a tenant whose
// partition moves (its owner left, or a standby took over) keeps its
// breaker instead of failing a threshold of attempts again on its new
// owner. A process that leaves (Close deletes its status) keeps seeding
// its open breakers until their time; one whose status expired does not.
// A guard the engine already has is left alone by seeds, whatever the
// fleet reports: one process alone never changes another's breaker.
//
// BreakerQuorum (off by default, at least 2) is for a tenant several
// processes handle at once (a header tenant over many partitions): when
// at least BreakerQuorum other live processes report its breaker open,
// the agent trips it here too (Consumer.TripBreakers), even if it exists
// and is closed, until the BreakerQuorum-th latest of their open-until
// times (the latest time at least that many of them still report it
// open). AgentStats counts the tenants at quorum and the breakers tripped.
//
// # Commands
//
// `ringfence status` shows a group's View; `ringfence tenant hold|release|
// quarantine|unquarantine|open|close|auto|weight N|concurrency N TENANT
// --reason TEXT` writes a ControlRecord (Control.Apply); `ringfence console
// --group` shows the View with the same buttons.
package fleet

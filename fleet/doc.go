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
// and applies it with SetControls before it returns, so call it before the
// consumer's Run; the agent then applies every change as its watch sees it,
// publishes the status every Interval (bounded to MaxTenants tenants, worst
// first), and passes the breakers other processes report open to
// SetBreakerSeeds. It makes no store call under a lock, and a record that
// does not decode is skipped with one log line.
//
// # Commands
//
// `ringfence status` shows a group's View; `ringfence tenant hold|release|
// quarantine|unquarantine|open|close|auto|weight N|concurrency N TENANT
// --reason TEXT` writes a ControlRecord (Control.Apply); `ringfence console
// --group` shows the View with the same buttons.
package fleet

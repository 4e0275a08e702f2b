// Package consumer is ringfence's engine between a message source (a Kafka
// or NATS adapter) and a handler. It holds no broker code: adapters
// implement [Source] (and [SpillLog]), and the engine runs every message
// through its tenant's own [policy.Guard] from a [scope.Scope].
//
// Each message's tenant key comes from Config.Tenant. Messages of one
// tenant from one partition form a lane (lane.go) and are handled in order,
// one at a time; lanes of different tenants run concurrently, up to
// Config.Concurrency handlers at once. A message without a usable key goes
// to the no-tenant bucket, a lane of its own whose messages are
// dead-lettered. A
// failed attempt is retried by the tenant's policy; a handler panic is
// recovered and counts as a failure ([PanicError]); each attempt's ctx ends
// at the policy's AttemptTimeout or what is left of its Deadline. What to
// do next is decided by pure functions (decide.go) and carried out by a
// worker's step (step.go). Delivery and the memory bounds are in
// deliver.go, Run, revocation and housekeeping in consumer.go, [Stats] in
// stats.go.
//
// No user callback (Handler, TenantFunc, OnEvent, the scope's and policy's
// hooks) and no Source, SpillLog or DLQ method is called while the engine
// holds a lock, so any of them may call back into the Consumer (each
// partition has its own lock; see [Consumer] for the rest). Run ends
// with a drain: partitions are paused, in-flight handlers finish (up to
// DrainTimeout, then their ctx is cancelled), their outcomes are settled
// and committed, and the source is stopped.
//
// # Parking
//
// When a tenant's breaker refuses an attempt, its lane parks: the head and
// everything behind it wait in memory, in order, until the breaker's
// RetryAfter, when a half-open breaker admits the head as a probe. Other
// tenants, even on the same partition, keep flowing. Only the engine's
// guard refusing a permit parks a lane: a handler error that wraps
// policy.ErrOpen (a downstream guard of its own) is the handler's failure.
// A partition that
// reaches a bound it cannot spill for (no SpillLog, or one that fails), or
// that holds ReadAhead messages of quick tenants, is paused (Source.Pause)
// until its pressure is gone. park.go.
//
// # Spilling
//
// With a [SpillLog], a lane whose tenant cannot make progress spills: when
// it is parked at MaxParkedPerTenant, when its oldest message has held the
// partition's commit for StuckAfter (the reason is dlq-unavailable when
// that message waits for a dead letter its DLQ refuses), or when its
// backlog passes MaxQueuedPerTenant. Its messages are appended, in order, to its spill
// log and their originals settled once the log acknowledged them, so the
// partition's commit moves on; the log is read back oldest first,
// RefeedWindow at a time, and its entries are removed only once settled.
// A crash duplicates, never loses. spill.go.
//
// # Dead letters
//
// A message goes to its tenant's DLQ when its error is permanent
// (policy.Permanent), at that attempt, or when there is evidence that it
// fails on its own: it failed while a message behind it, tried right
// after, succeeded, it failed once more after that, and (when more
// messages wait behind the one that succeeded) one of those succeeded
// after that last failure. Such messages are handled ahead of their head,
// the only reordering the engine makes (EventReordered). An outage, where
// every message fails with an error not marked permanent, gives no
// evidence and dead-letters nothing: the breaker trips and the tenant
// parks. A lone message with nothing behind it is never dead-lettered for
// failing.
//
// A permanent error is the message's fault, not its dependency's: the
// tenant's breaker does not count it (unless the policy sets
// Breaker.CountPermanent), so a burst of poison never parks the tenant.
// Each poison message is dead-lettered as it comes up, at the speed the
// DLQ takes writes, and the good messages behind it are handled as soon as
// they come up; a tenant that spilled meanwhile is re-fed RefeedWindow at
// a time.
//
// A dead letter the DLQ refuses stays unsettled at the head of its lane
// and is written again after a wait that doubles from DLQRetry up to
// DLQProbe (1s): each write is a probe of the DLQ, so dead letters flow
// again within about DLQProbe of its return. Meanwhile the messages behind
// it wait and, after StuckAfter, spill (reason dlq-unavailable);
// TenantStats.DLQUnavailable says why, and no other tenant waits. A dead
// letter the DLQ can never write (dlq.ErrUnwritable) is set aside,
// unsettled, and tried again every minute. deadletter.go; the judging is
// in step.go.
//
// # Controls
//
// [Consumer.SetControls] publishes operators' standing instructions per
// tenant ([Control]), applied at once to the tenants in the engine and to
// tenants met later before their first attempt. A Hold stops trying the
// tenant: its lanes wait (their messages count as parked, so MaxParked
// and StuckAfter spill them as they spill a parked tenant), none is lost
// or dead-lettered for it, and a release runs them again in order and
// re-feeds what spilled. A Quarantine spills the tenant's messages with no
// attempt (reason quarantine) and re-feeds nothing until it is cleared.
// Breaker overrides go through policy.Guard.Force; Weight and Concurrency
// replace the policy's share and bulkhead. The engine reads a tenant's
// control once per lane scheduling, never per message.
// [Consumer.SetBreakerSeeds] starts a new guard open until a time another
// process saw its breaker open until (policy.Guard.Trip). controls.go.
//
// # Commits
//
// A message is settled (Source.Settle) only after its handler succeeded,
// its dead letter was written, or its spill-log copy was acknowledged. A
// partition's commit point is the offset of its oldest unsettled message,
// passed to Source.Commit by housekeeping within a tick, and at once when
// the partition is revoked or the engine drains. A parked message holds
// back its partition's commit, not its consumption; Stats shows the commit
// lag per partition and the tenants that cause it. After a crash everything
// unsettled is delivered again; a revoked partition's queued messages are
// dropped for the new owner. commit.go.
//
// # Memory
//
// Besides the messages it holds (bounded by MaxQueuedPerPartition and the
// other bounds of Config), the engine keeps state for each tenant and each
// lane it has seen. A tenant with nothing in the engine is idle: past
// Config.MaxIdleTenants idle tenants the one idle longest is forgotten,
// and a partition past as many lanes (fewer with many partitions: its
// share, Stats.Tracked.MaxLanes) drops those that hold nothing (one made
// for a single message as soon as it is handled, others a few for each
// lane it makes), whose memory its next lanes reuse; so the engine's
// memory does not grow with the number of distinct tenants it has seen
// (TestEngineHeap), nor a message's cost much (BenchmarkEngine). A tenant
// that comes back starts afresh; its guard lives in the scope. idle.go.
// While the engine tracks more than one and a half times MaxIdleTenants
// tenants, the first message of a tenant with no guard anywhere, its
// lane's only one, runs on a template guard that records nothing: a
// success makes no guard, a failure makes the tenant's (loneOK in
// step.go).
//
// # Time
//
// [Stats] answers in seconds as well as counts. A message's age counts from
// its produce time (Message.Time: the Kafka record's timestamp, the
// JetStream message's; its receipt when it has none), which spill logs
// keep, so a re-fed message is as old as its original. Per tenant:
// TimeLag (its oldest unsettled message), OldestParked, SpillBacklogAge,
// OpenSince and a Dwell histogram of produce to settle over
// [DwellBuckets]; per partition, TimeLag. A settle adds to its tenant's
// histogram with the engine's coarse clock (a tick's resolution), a
// couple of atomic adds per run of messages; the ages are read from the
// lanes' head messages by Stats. timelag.go.
//
// # Scheduling
//
// Workers take ready lanes in turns: a lane runs its turn (one message per
// unit of its policy's Weight, more for a tenant whose calls are quick)
// and goes to the back of its partition's queue, and workers move between
// partitions every few messages. Each tenant has a bulkhead of
// TenantConcurrency messages in flight, so a tenant whose calls hang holds
// a bounded share of the workers. The worker loop and turns are in
// worker.go, the scheduler's ring of partitions in sched.go.
//
// # Tracing
//
// With Config.Tracing.Provider set, each message gets an OpenTelemetry span
// "process <destination>" (SpanKindConsumer, the messaging semantic
// conventions' attributes, the tenant's token under ringfence.tenant),
// started when the engine receives it and ended when it is settled:
// handled, dead-lettered, or appended to its spill log (a "spilled" event).
// Its events say what happened on the way: attempt (number, error), retry,
// park, resume, re-fed, dlq-failed, set-aside, dead-letter (reason). The
// producer's context, read from the message's headers (W3C traceparent by
// default), is a link, or the parent with ParentFromProducer. The handler's
// ctx carries the span, so the handler's own spans are its children. A
// spilled message's copy and a dead-letter record carry the span's
// traceparent in a ringfence-traceparent header (HeaderTraceParent); the
// span of the re-fed copy, or of a replayed dead letter, is linked to it
// (the header stays on that message, as ringfence-redrive does on a
// replayed one). A message the engine lets go of unsettled ends its span
// with a "revoked" or "shutdown" event (its redelivery starts one). With no
// Provider the engine starts nothing and allocates nothing for tracing
// (BenchmarkEngineTracing guards this). The spans are started and ended in
// trace.go.
package consumer

// Package consumer is ringfence's engine between a message source (a Kafka
// or NATS adapter) and a handler. It holds no broker code: adapters
// implement [Source], and the engine runs every message through its
// tenant's own [policy.Guard] from a [scope.Scope].
//
// # Lanes
//
// Each message's tenant key comes from a [TenantFunc] (a header, the message
// key, a subject token). Messages of one tenant from one partition form a
// lane and are handled in order; lanes of different tenants run
// concurrently, up to Config.Concurrency handlers at once. A worker runs up
// to 16 messages of a lane and then puts it at the back of the queue, so a
// busy tenant cannot starve the others.
//
// # Parking
//
// When a tenant's breaker refuses an attempt, its lane parks: the head
// message and everything behind it wait in memory, in order, until the
// breaker's RetryAfter, when the lane asks again (a half-open breaker then
// admits the head as a probe). Other tenants, even on the same partition,
// keep flowing. Parked messages are bounded per tenant
// (MaxParkedPerTenant) and in total (MaxParked); a bound reached pauses the
// partition the message came from (Source.Pause) until the pressure is
// gone, so nothing is ever dropped.
//
// # Dead letters
//
// A message goes to its tenant's DLQ when its error is permanent
// (policy.Permanent), or when there is evidence that it fails on its own:
// it failed while a message behind it, tried right after, succeeded, and
// it failed once more after that. A transient outage of a tenant's
// dependency produces no such evidence (every message fails), so it
// dead-letters nothing: the failures trip the breaker and the tenant parks.
//
// The evidence is gathered by judging. A head message that used all its
// attempts while the breaker stayed closed, or that failed PoisonProbes
// probes in a row, becomes suspect. The next step tries the messages
// behind it, in order and under one permit, up to a span that starts at
// one and doubles each time they all fail (so a run of bad messages cannot
// stall a lane), stopping at the first success. If they all fail, it is an
// outage: nothing moves and the head starts over after a growing backoff.
// If one succeeds, the head gets one last attempt and is dead-lettered if
// it fails again (reason exhausted, panic or poison); the messages that
// failed before the winner carry the same evidence and are judged next.
// Messages handled this way run ahead of the head and of the messages tried
// before them: the only reordering the engine makes, reported as
// EventReordered. Evidence is used only once a message is suspect again
// (its own attempts used up, or its probes failed), never to cut its
// retries short. A lone message with nothing behind it and no such
// evidence is never dead-lettered for failing: it keeps retrying with a
// growing backoff, or parks behind the breaker, until a message behind it
// can judge it. Messages without a usable tenant key go to the reserved
// no-tenant bucket with a reason.
//
// # Commits
//
// A message is settled (Source.Settle, then the watermark) only after its
// handler succeeded or its dead letter was durably written; a DLQ that is
// down keeps the message unsettled and retried. Each partition keeps a
// watermark, the lowest unsettled offset, and Source.Commit is called when
// it advances: a parked message holds back its partition's commit, not its
// consumption. After a crash everything unsettled is delivered again
// (at-least-once). A revoked partition's queued and parked messages are
// dropped (the new owner gets them) and its tracking reset.
//
// # Shutdown
//
// Run returns after a drain: partitions are paused, in-flight handlers
// finish (up to DrainTimeout, then their ctx is cancelled), their outcomes
// are settled and committed, and the source is stopped.
//
// # Panics
//
// A handler panic is recovered, counted as a failure ([PanicError]) and
// reported as EventPanicked; the message is retried like any failure.
package consumer

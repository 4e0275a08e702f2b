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
// (policy.Permanent), or when it used all its attempts while the tenant's
// breaker stayed closed and the tenant's next message then succeeded (the
// failure is the message's own). If the next message fails too, the
// tenant's dependency is failing: nothing is dead-lettered, the failures
// trip the breaker and the tenant parks. A head message that keeps failing
// as a probe is judged the same way after PoisonProbes probes: the head and
// then the next message are tried under one probe, and if only the next one
// succeeds the head is dead-lettered as poison. Before it is dead-lettered,
// a judged head gets one last attempt; if that succeeds (the outage ended
// at that moment) it is handled just after the message that judged it,
// the only reordering the engine ever makes. A lone
// message that exhausts its attempts with no other message to compare
// against is dead-lettered as exhausted; a lone message that keeps the
// breaker open waits (probing at the capped open period) until another
// message of its tenant arrives to judge it. Messages without a usable
// tenant key go to the reserved no-tenant bucket with a reason.
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

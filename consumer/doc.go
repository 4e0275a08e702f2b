// Package consumer is ringfence's engine between a message source (a Kafka
// or NATS adapter) and a handler. It holds no broker code: adapters
// implement [Source] (and [SpillLog]), and the engine runs every message
// through its tenant's own [policy.Guard] from a [scope.Scope].
//
// Where things happen, one hop from here: the decisions (retry, park,
// judge, dead-letter, settle) are pure functions in decide.go; a worker's
// step on a lane (guard, handler, dead letter, settle) is in step.go; lanes
// and their queues in lane.go; the per-partition state and the scheduler
// in shard.go and worker.go; delivery and bounds in deliver.go; spilling in
// spill.go; Run, revocation and commits in consumer.go; Stats in stats.go;
// the invariant checker the tests run in invariants.go.
//
// # Lanes
//
// Each message's tenant key comes from a [TenantFunc] (a header, the message
// key, a subject token); Config.Tenant is the one place it is defined.
// Messages of one tenant from one partition form a lane and are handled in
// order, one at a time; lanes of different tenants run concurrently, up to
// Config.Concurrency handlers at once. A message without a usable key goes
// to the no-tenant bucket, a lane of its own that is never confused with a
// tenant (whatever its key).
//
// # Scheduling and bulkheads
//
// Workers take ready lanes in turns, not in arrival order: a lane runs its
// turn and goes to the back of its partition's queue, and workers move
// between partitions every few messages. A turn is one message per unit of
// its tenant's policy Weight, times as many calls as fit, by the tenant's
// latency estimate, into 10µs (calls of a few microseconds, up to 64) or
// into 1ms (calls under 500µs, up to 16). So a tenant's backlog delays
// another tenant's message by about one handler call, or at most about a
// millisecond of its calls. While no other lane of its partition is ready,
// a worker runs up to 64 messages of one lane (16 if its calls are not
// quick) before it takes the partition's lock again to settle them (fewer
// past the lane's turn as soon as another lane becomes ready). Each tenant
// has a bulkhead: at most TenantConcurrency of its messages in flight at
// once (Concurrency/4 by default; its policy's Bulkhead may set it, or let
// it follow the tenant's latency), so a tenant whose calls are slow or hang
// holds a bounded share of the workers; a tenant at its limit waits without
// holding one.
//
// # Parking
//
// When a tenant's breaker refuses an attempt (it tripped on failures, slow
// calls or timeouts), its lane parks: the head message and everything
// behind it wait in memory, in order, until the breaker's RetryAfter, when
// the lane asks again (a half-open breaker then admits the head as a
// probe). Other tenants, even on the same partition, keep flowing.
//
// # Spilling
//
// A tenant that cannot make progress must not cost its partition-mates
// anything, for however long it lasts. With a [SpillLog] configured, a lane
// spills when its tenant is parked at MaxParkedPerTenant, when its oldest
// message has held its partition's commit for StuckAfter, or when its
// backlog passes MaxQueuedPerTenant (a hot tenant): its messages are
// appended, in order, to its durable spill log, and only once the log
// acknowledged them are the originals settled, so the partition's commit
// moves on. Later messages of the lane follow into the log until it is read
// back to its end: the lane is re-fed oldest first, RefeedWindow at a time
// (one at a time while its breaker is open), and log entries are removed
// (SpillLog.Commit) only after they are settled. A crash at any point
// duplicates, never loses; duplicates are dropped on re-feed. Without a
// SpillLog, a bound that is reached pauses the partition (Source.Pause)
// instead, which stops its other tenants too.
//
// A partition is also paused, briefly, while it holds Config.ReadAhead
// messages of quick tenants (PauseReadAhead): flow control, not a bound
// reached on a tenant's account, since workers get through such messages
// in microseconds (see ReadAhead).
//
// # Dead letters
//
// A message goes to its tenant's DLQ when its error is permanent
// (policy.Permanent), or when there is evidence that it fails on its own:
// it failed while a message behind it, tried right after, succeeded, it
// failed once more after that, and (when more messages wait behind the one
// that succeeded) one of those succeeded after that last failure too. A
// transient outage of a tenant's
// dependency produces no such evidence (every message fails), so it
// dead-letters nothing: the failures trip the breaker and the tenant parks.
// A handler's own errors are the handler's, even when they wrap
// policy.ErrOpen (a downstream guard of its own): only the engine's guard
// refusing a permit parks a lane.
//
// The evidence is gathered by judging. A head message that used all its
// attempts (or its policy's Deadline for the round) while the breaker
// stayed closed, or that failed PoisonProbes probes in a row, becomes
// suspect. The next step tries the messages behind it, in order and under
// one permit, up to a span that starts at one and doubles each time they
// all fail (so a run of bad messages cannot stall a lane), stopping at the
// first success. If they all fail, it is an outage: nothing moves and the
// head starts over after a growing backoff. If one succeeds, the head gets
// one last attempt; if it fails again, the messages behind the winner are
// tried, in order and up to the same span, until one succeeds (a
// confirmer: the dependency worked after the head failed, which tells the
// head's fault from an outage that came back between the winner's call and
// the head's). Then the head is dead-lettered (reason exhausted, panic or
// poison); if they all fail too, the outage is back and the head starts
// over like a head whose round found no winner. With no message behind the
// winner, the head is dead-lettered at once. The messages that failed before the winner
// carry the same evidence and are judged next: as head, each is tried
// again, then the messages behind it; if they all fail the evidence is
// dropped (the outage may be back) and it waits like a lone message. So a
// run of poison messages needs a success behind each of them: followed by
// one good message, the first is dead-lettered and the others wait for the
// tenant's next message (winners and confirmers are handled ahead of their
// heads, so the last poison messages of a burst of alternating poison and
// good ones may wait so too). Messages handled this way
// run ahead of the head: the only reordering the engine makes, reported as
// EventReordered. A lone message with nothing behind it and no evidence is
// never dead-lettered for failing: it keeps retrying with a growing
// backoff, or parks behind the breaker; after StuckAfter it spills, so it
// no longer holds its partition's commit.
//
// A dead letter the DLQ refuses keeps its message unsettled and is retried
// with a doubling wait; one the DLQ says can never be written
// (dlq.ErrUnwritable) is set aside: logged once at Error, counted in Stats,
// out of its lane so its tenant moves on, still unsettled (at-least-once),
// and tried again every minute.
//
// # Commits
//
// A message is settled (Source.Settle, then its partition's watermark) only
// after its handler succeeded, its dead letter was durably written, or its
// spill-log copy was acknowledged. A partition's commit point is the offset
// of its oldest unsettled message (its lanes hold them in offset order, so
// no per-message list is kept: memory proportional to what is unsettled),
// found by housekeeping once the oldest may have settled, and passed to
// Source.Commit within a tick (5ms; a partition of more than 16 tenants'
// lanes is scanned less often, at most a second apart), and at once when the
// partition is revoked or the engine drains. A parked message holds back
// its partition's commit, not its consumption, and Stats shows the commit
// lag per partition and the tenants that cause it. After a crash
// everything unsettled is delivered again. A revoked partition's queued and
// parked messages are dropped (the new owner gets them) and its tracking
// reset.
//
// # Callbacks and locks
//
// No user callback (Handler, TenantFunc, OnEvent, the scope's and
// policy's hooks) and no Source, SpillLog or DLQ method is called while the
// engine holds a lock, so any of them may call back into the Consumer.
// Each partition has its own lock; see [Consumer] for the rest.
//
// # Shutdown
//
// Run returns after a drain: partitions are paused, in-flight handlers
// finish (up to DrainTimeout, then their ctx is cancelled), their outcomes
// are settled and committed, and the source is stopped.
//
// # Panics and time limits
//
// A handler panic is recovered, counted as a failure ([PanicError]) and
// reported as EventPanicked; the message is retried like any failure. Each
// attempt's ctx ends at its tenant policy's AttemptTimeout (or what is left
// of its Deadline); a hanging call that honours ctx ends there and counts
// as a failure.
package consumer

// Package scope keeps one [policy.Guard] per key (per tenant), bounded in
// memory whatever the key stream.
//
// [New] takes a template [policy.Policy] and [Options]; [Scope.For] returns
// the guard of a key, building it on first sight. Options.Shape customises
// the policy per key (a premium tenant gets a longer deadline); it runs once
// per key life and its result is cached in the guard.
//
// # Lookups never wait
//
// Keys live in an open-addressing hash table of atomic pointers, allocated
// at most half full: a lookup of a present key hashes it (hash/maphash),
// probes a few slots without a lock and allocates nothing. A new key is
// inserted under a mutex that only inserts and evictions take, for a few
// pointer stores. Sweeps are incremental: each lookup that inserts a key
// while a sweep runs scans a fixed number of slots, if no other goroutine
// is doing so, and evicts one of the cold keys found so far (two or more
// only while many wait), so that no lookup pays for a burst of cold keys; a
// Scope owns no goroutine.
// All guards built from the template share one [policy.Compiled] policy, so
// a key costs its guard's own state (about 1.2 KiB) and an entry that holds
// the key and the [policy.Guard] handle (64 bytes for a string key). The states of evicted
// guards are reused for new keys (a [policy.Recycler]), so under churn a new
// key allocates only its entry.
//
// # Eviction
//
// Eviction is approximate, after CLOCK. Each lookup stamps its entry with
// the current epoch (a store only when the stamp changes); a sweep starts a
// new epoch and keeps the keys looked up since the previous sweep started,
// up to MaxKeys of them. A key the sweep found cold but that is looked up
// again (or whose breaker opens) before its turn to leave is kept as well.
// The scope may exceed MaxKeys between sweeps. A key
// that returns after its eviction gets a fresh guard (and Shape runs again).
//
// A caller may still hold the guard of an evicted key (a lookup racing with
// the eviction returns it too). That guard keeps working, but its state now
// serves another key, so from its next call it runs on a fresh state of its
// own (closed breaker, full budget): calls through an evicted guard never
// reach the guard of any key in the scope. See [policy.Recycler.Retire].
//
// A sweep does not silently reset protection: a guard whose breaker is open
// or half-open, or whose key is pinned ([Scope.Pin], for example while the
// consumer holds parked messages of that tenant), survives sweeps while the
// scope holds fewer than Options.HardCeiling keys (default 4*MaxKeys).
// Beyond the ceiling they are evicted too, so Len never exceeds
// HardCeiling+MaxKeys: a For of a new key that would go past that bound
// finishes the sweep itself first, the only case in which a lookup waits for
// a sweep.
package scope

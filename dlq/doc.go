// Package dlq defines ringfence's dead-letter record, its "ringfence-" header
// format, the tenant token used to name per-tenant DLQ topics and subjects,
// and the Sink and Inspector interfaces that each broker adapter implements.
package dlq

// Package policy compares ringfence's policy.Guard with the executors a
// user would otherwise pick: sony/gobreaker's breaker alone, and
// failsafe-go's retry policy composed with a circuit breaker. The rows are
// the success path, an open breaker's rejection, and the two-step
// Allow/Done form the consumer engine uses. It holds only benchmarks; from
// bench/:
//
//	go test -run '^$' -bench . -benchmem ./policy/
package policy

// Package consumertest holds an in-memory Source and Sink and the
// conformance suites every ringfence adapter must pass: Run for a source,
// RunSpillLog for a spill log, and RunInspector for a dead-letter queue
// (dlq.Sink and dlq.Inspector).
package consumertest

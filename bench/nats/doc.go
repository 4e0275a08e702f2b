// Package nats compares consuming a JetStream stream (on an in-process
// nats-server, no-op handler) through ringfence's engine with nats.go's own
// Consume and Ack, and with ringfence's nats.Source driven by a loop that
// settles at once. It holds only benchmarks and a diagnostic soak of the
// Source (TestSourceStallSoak, skipped unless RINGFENCE_STALL_ROUNDS is
// set); from bench/:
//
//	go test -run '^$' -bench 'Consume$' -benchtime 50000x ./nats/
package nats

// Command kafka-key consumes a Kafka topic whose message key is the tenant,
// on an in-process broker (franz-go kfake). One tenant's payment provider is
// down for a second: its breaker opens and its messages park, in order,
// while the other tenants keep flowing; when the provider is back they are
// all handled and none is dead-lettered. One malformed order fails for good
// and goes to its tenant's own DLQ topic.
//
//	go run ./examples/kafka-key
package main

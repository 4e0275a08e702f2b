// Package kafkatest starts an in-process Kafka cluster (franz-go's kfake)
// on 127.0.0.1 for tests, examples and the demo. It speaks the real Kafka
// protocol, so kafka-go and kcat work against it unchanged.
package kafkatest

// Package kafka compares consuming a Kafka topic (on an in-process kfake
// broker, no-op handler) through ringfence's engine with the same
// kafka.Source alone, the Source handing each fetched slice to one other
// goroutine (the least any engine that runs handlers off the fetch
// goroutine costs), segmentio/kafka-go's group Reader, and franz-go's kgo
// PollFetches loop; BenchmarkConsumeTenants runs the source and the engine
// over 100,000 tenants, each message its own. It holds only benchmarks;
// from bench/:
//
//	go test -run '^$' -bench 'Consume$' -benchtime 1x -count 3 ./kafka/
//	go test -run '^$' -bench 'ConsumeTenants$' -benchtime 1x -count 3 ./kafka/
package kafka

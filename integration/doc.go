// Package integration holds ringfence's end-to-end tests against real
// brokers in Docker containers, started with testcontainers-go, including
// faults: a broker stopped and restarted, a consumer process killed with
// SIGKILL, a DLQ broker paused, a consumer group rebalancing.
//
// # Running
//
//	TESTCONTAINERS_RYUK_DISABLED=true TESTCONTAINERS_HOST_OVERRIDE=127.0.0.1 \
//	    go test -race -count=1 ./integration/...
//
// The reaper image cannot be pulled without a registry, so the reaper is
// disabled and every test terminates its own containers. Without a reachable
// Docker engine the tests skip with one line; with the CI environment
// variable set they fail instead.
//
// # Images
//
// No registry is needed: the broker images are built locally FROM scratch
// around Go binaries compiled from module sources (see internal/brokerimage):
// a Kafka broker on franz-go's kfake with a data dir (so data survives a
// container restart) and the real NATS server with JetStream. The first run
// compiles and builds them; later runs reuse an image whose binary is
// unchanged. Two environment variables point the suite at other images
// instead, where a registry is reachable:
//
//	RINGFENCE_KAFKA_IMAGE  e.g. apache/kafka:4.1.0 (configured as a one-node KRaft broker)
//	RINGFENCE_NATS_IMAGE   e.g. nats:2.12 (run with -js -sd /data -p 4222)
//
// # Reconciliation
//
// Each scenario ends by reconciling every produced message id: handled
// (recorded by an idempotent sink) or present in a dead-letter queue, and
// prints exactly one line
//
//	reconcile: scenario=NAME broker=kafka|nats produced=N handled=H deadlettered=D lost=L duplicates=X
//
// failing unless lost=0.
package integration

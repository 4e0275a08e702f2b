// Command kfakebroker runs a one-broker Kafka cluster (franz-go kfake) for the
// container images of the integration tests.
//
// It listens on KFAKE_LISTEN (default 0.0.0.0:9092) but advertises
// KFAKE_ADVERTISE (default 127.0.0.1:9092): Kafka clients dial the address the
// broker advertises, so inside a container that must be the host-mapped
// address. State is kept under KFAKE_DATA_DIR (default /data) and reloaded on
// start, so a container stop and start keeps topics, records and committed
// offsets. SIGTERM and SIGINT close the cluster, which persists everything.
//
// Consumer groups accept session timeouts down to 500ms and rebalance without
// an initial delay, so tests notice a killed or joining member in seconds.
//
// Other settings: KFAKE_PARTITIONS, the partition count of auto-created
// topics (default 3); KFAKE_LOG, a kfake log level (none, error, warn, info,
// debug; default warn).
package main

// Package brokerimage builds the broker container images the integration
// tests run, without any container registry.
//
// Each image is a Go binary compiled from module sources (CGO_ENABLED=0,
// -trimpath) copied into a FROM scratch image: the Kafka image runs
// internal/cmd/kfakebroker (franz-go kfake with a data dir), the NATS image
// runs the real github.com/nats-io/nats-server/v2. An image is tagged by the
// SHA-256 of its binary, so an unchanged binary reuses the image already in
// the Docker engine and a changed one gets a new tag (older tags of the same
// image are then removed, unless a container still uses them).
//
// Setting RINGFENCE_KAFKA_IMAGE or RINGFENCE_NATS_IMAGE skips the build and
// names an image to use instead (e.g. apache/kafka or nats, where a registry
// is reachable).
package brokerimage

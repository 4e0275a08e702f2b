// Package brokertest starts Kafka and NATS brokers in Docker containers for
// tests, with the faults the integration scenarios need: stop and start
// (data kept), pause and unpause.
//
// Images come from [brokerimage] (built locally FROM scratch, or named by
// RINGFENCE_KAFKA_IMAGE / RINGFENCE_NATS_IMAGE). Every container is
// terminated by the test that started it (t.Cleanup); the testcontainers
// reaper is not needed. The package defaults TESTCONTAINERS_RYUK_DISABLED=true
// and TESTCONTAINERS_HOST_OVERRIDE=127.0.0.1 when they are unset (env.go).
//
// # Docker missing
//
// [RequireDocker] skips the test with one line when no Docker engine answers,
// and fails it instead when the CI environment variable is set, so a CI
// machine without Docker cannot pass by skipping.
//
// # Addresses
//
// Each broker's client port is mapped explicitly to a free loopback port P
// (127.0.0.1:P), chosen before the container starts, so the Kafka broker can
// advertise exactly the address clients dial, and so the address survives a
// stop and start of the container.
package brokertest

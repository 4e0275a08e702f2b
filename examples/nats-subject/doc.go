// Command nats-subject consumes a JetStream stream whose subjects carry the
// tenant, "orders.<tenant>.created", on an in-process NATS server. globex's
// dependency stays down until every other tenant's orders are handled (or
// 5s pass): with per-tenant breakers, acme and initech never wait for it.
// When globex's dependency is back, its parked orders are handled in order
// and nothing is dead-lettered.
//
//	go run ./examples/nats-subject
package main

// Command nats-subject consumes a JetStream stream whose subjects carry the
// tenant, "orders.<tenant>.created", on an in-process NATS server. globex's
// dependency stays down until every other tenant's orders are handled (or
// 5s pass): with per-tenant breakers, acme and initech never wait for it.
// When globex's dependency is back, its parked orders are handled in order
// (but for one the engine tried behind a failing head, as evidence against
// it, if the dependency came back just then: it reports that with
// EventReordered) and nothing is dead-lettered.
//
//	go run ./examples/nats-subject
package main

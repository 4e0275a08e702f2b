// Package natstest runs an in-process nats-server with JetStream on a file
// store for tests, examples and the demo: start on a free loopback port,
// wait until it accepts connections, restart it on the same port and store
// directory (to test that nothing is lost), and shut it down when the test
// or program ends.
package natstest

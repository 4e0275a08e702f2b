// Package consumertest holds an in-memory Source and Sink and the
// conformance suite that every ringfence adapter must pass.
package consumertest

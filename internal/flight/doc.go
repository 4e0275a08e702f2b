// Package flight runs one lookup per key at a time and keeps its result
// (a keyed, caching single-flight), for work such as creating a DLQ topic
// or opening an object store: callers for one key share one network call,
// and no lock is held while it runs, so a slow key never delays another.
package flight

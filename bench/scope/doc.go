// Package scope compares a lookup of ringfence's scope.Scope with what a
// user would write instead: an RWMutex-guarded map of gobreaker breakers, a
// sync.Map, and a maypok86/otter cache (BenchmarkHit, every key present),
// and with otter's loading Get under churn (BenchmarkChurn: Zipf keys over
// a million, 1024 kept, with latency percentiles). It holds only
// benchmarks; from bench/:
//
//	go test -run '^$' -bench 'Hit|Churn' -benchmem ./scope/
package scope

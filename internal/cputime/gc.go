package cputime

import (
	"runtime/metrics"
	"time"
)

// gcNames are the runtime metrics GC reads: the CPU the collector took
// (its mark workers, dedicated, fractional and idle, its assists and its
// pauses) and the cycles it completed.
var gcNames = [...]string{"/cpu/classes/gc/total:cpu-seconds", "/gc/cycles/total:gc-cycles"}

// GC is the CPU time the garbage collector has taken so far, estimated by
// the runtime (its idle-time marking included: CPU a busy process would
// not have given it), and the GC cycles completed. Benchmarks report it
// beside Process: of two rows that differ in the heap they keep live, the
// one that keeps more pays for it here.
func GC() (cpu time.Duration, cycles uint64) {
	var s [len(gcNames)]metrics.Sample
	for i, n := range gcNames {
		s[i].Name = n
	}
	metrics.Read(s[:])
	if s[0].Value.Kind() == metrics.KindFloat64 {
		cpu = time.Duration(s[0].Value.Float64() * float64(time.Second))
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		cycles = s[1].Value.Uint64()
	}
	return cpu, cycles
}

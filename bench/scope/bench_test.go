package scope_test

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/sony/gobreaker/v2"

	"github.com/ringfence/ringfence/internal/cputime"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

const benchKeys = 1000 // fits the default MaxKeys: every lookup is a hit

func benchKeyNames(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%d", i)
	}
	return keys
}

// runHit runs lookup over the keys serially and in parallel.
func runHit(b *testing.B, keys []string, lookup func(string) bool) {
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		cpu := cputime.Process()
		i := 0
		for b.Loop() {
			if !lookup(keys[i]) {
				b.Fatal("miss")
			}
			if i++; i == len(keys) {
				i = 0
			}
		}
		reportCPU(b, cpu)
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		cpu := cputime.Process()
		defer reportCPU(b, cpu)
		var seed sync.Mutex
		next := 0
		b.RunParallel(func(pb *testing.PB) {
			seed.Lock()
			i := next * 97 % len(keys)
			next++
			seed.Unlock()
			for pb.Next() {
				if !lookup(keys[i]) {
					panic("miss")
				}
				if i++; i == len(keys) {
					i = 0
				}
			}
		})
	})
}

// reportCPU reports the process CPU time per op since cpu (summed over
// goroutines for parallel runs), a figure less sensitive than ns/op to other
// processes on the machine.
func reportCPU(b *testing.B, cpu time.Duration) {
	if c := cputime.Process(); c > 0 && b.N > 0 {
		b.ReportMetric(float64(c-cpu)/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkHit compares a hit of Scope.For with what a user would write
// instead: an RWMutex-guarded map of gobreaker breakers, a sync.Map, and an
// otter cache.
func BenchmarkHit(b *testing.B) {
	keys := benchKeyNames(benchKeys)

	b.Run("scope.For", func(b *testing.B) {
		s := scope.New(policy.Default(), scope.Options[string]{})
		for _, k := range keys {
			s.For(k)
		}
		// Fewer keys than MaxKeys: no sweep is due, none may evict.
		if st := s.Stats(); st.Sweeps != 0 || st.Size != len(keys) {
			b.Fatalf("scope holds %d of %d keys after %d sweeps", st.Size, len(keys), st.Sweeps)
		}
		runHit(b, keys, func(k string) bool { return s.For(k) != nil })
	})

	b.Run("rwmutex-map-gobreaker", func(b *testing.B) {
		var mu sync.RWMutex
		m := make(map[string]*gobreaker.CircuitBreaker[any], len(keys))
		for _, k := range keys {
			m[k] = gobreaker.NewCircuitBreaker[any](gobreaker.Settings{Name: k})
		}
		runHit(b, keys, func(k string) bool {
			mu.RLock()
			cb := m[k]
			mu.RUnlock()
			return cb != nil
		})
	})

	b.Run("sync.Map", func(b *testing.B) {
		var m sync.Map
		for _, k := range keys {
			g, _ := policy.New(policy.Default())
			m.Store(k, g)
		}
		runHit(b, keys, func(k string) bool {
			g, ok := m.Load(k)
			return ok && g.(*policy.Guard) != nil
		})
	})

	newOtter := func(b *testing.B) *otter.Cache[string, *policy.Guard] {
		c := otter.Must(&otter.Options[string, *policy.Guard]{MaximumSize: scope.DefaultMaxKeys})
		for _, k := range keys {
			g, _ := policy.New(policy.Default())
			c.Set(k, g)
		}
		c.CleanUp()
		return c
	}
	b.Run("otter.GetIfPresent", func(b *testing.B) {
		c := newOtter(b)
		runHit(b, keys, func(k string) bool {
			g, ok := c.GetIfPresent(k)
			return ok && g != nil
		})
	})
	b.Run("otter.Get", func(b *testing.B) {
		c := newOtter(b)
		ctx := context.Background()
		loader := otter.LoaderFunc[string, *policy.Guard](func(context.Context, string) (*policy.Guard, error) {
			return policy.New(policy.Default())
		})
		runHit(b, keys, func(k string) bool {
			g, err := c.Get(ctx, k, loader)
			return err == nil && g != nil
		})
	})
}

// hist is a log-linear latency histogram: 32 sub-buckets per power of two
// (relative error under 3%), no allocation per sample.
type hist struct{ n [64 * 32]uint64 }

func (h *hist) add(d time.Duration) {
	v := uint64(max(d, 1))
	e := bits.Len64(v) - 1 // v in [2^e, 2^(e+1))
	sub := uint64(0)
	if e >= 5 {
		sub = (v >> (e - 5)) & 31
	} else {
		sub = (v << (5 - e)) & 31
	}
	h.n[e*32+int(sub)]++
}

func (h *hist) merge(o *hist) {
	for i := range h.n {
		h.n[i] += o.n[i]
	}
}

// quantile returns the lower bound of the bucket holding quantile q.
func (h *hist) quantile(q float64) float64 {
	var total uint64
	for _, c := range h.n {
		total += c
	}
	want := uint64(math.Ceil(q * float64(total)))
	var run uint64
	for i, c := range h.n {
		run += c
		if run >= want && c > 0 {
			e, sub := i/32, i%32
			return math.Ldexp(1+float64(sub)/32, e)
		}
	}
	return 0
}

// zipfKeys returns n key indexes drawn from a Zipf distribution with
// exponent exp (v=1) over universe keys.
func zipfKeys(n, universe int, exp float64, seed uint64) []int32 {
	z := rand.NewZipf(rand.New(rand.NewPCG(seed, seed^0x9e37)), exp, 1, uint64(universe-1))
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(z.Uint64())
	}
	return out
}

// BenchmarkChurn looks keys up from a Zipf distribution over 1,000,000 keys
// with MaxKeys 1024, so that sweeps run all the time, and reports the
// median and 99.9th percentile of For latency (each call timed with
// time.Now), their ratio, the hit ratio, the number of sweeps and the page
// faults of the timed loop; a serial row also reports the host's floor
// (floor-p99.9-ns, see spinLike), to read its tail against. s=1.01 is
// the usual cache-benchmark skew (most lookups miss: the median is a miss);
// s=1.2 is more skewed (the median is a hit).
func BenchmarkChurn(b *testing.B) {
	const universe = 1_000_000
	keys := packedKeys(universe)
	for _, exp := range []float64{1.01, 1.2} {
		seq := zipfKeys(1<<20, universe, exp, 1)
		b.Run(fmt.Sprintf("zipf=%v", exp), func(b *testing.B) { churn(b, keys, seq) })
	}
}

// packed holds n keys in one string, so that the benchmark's own million
// keys add no pointers for the GC to scan; at returns key i without
// allocating.
type packed struct {
	all string
	end []int32
}

func packedKeys(n int) *packed {
	var sb strings.Builder
	p := &packed{end: make([]int32, n)}
	for i := range n {
		fmt.Fprintf(&sb, "tenant-%d", i)
		p.end[i] = int32(sb.Len())
	}
	p.all = sb.String()
	return p
}

func (p *packed) at(i int32) string {
	start := int32(0)
	if i > 0 {
		start = p.end[i-1]
	}
	return p.all[start:p.end[i]]
}

// lookupFunc looks key up (building its guard on a miss) and returns the
// guard, how long the lookup itself took, and whether it found the key. Each
// store times only its own call; telling hits from misses is done outside
// the timed part (and, in parallel runs, approximately).
type lookupFunc func(key string) (g *policy.Guard, took time.Duration, hit bool)

// churnStore is a keyed-guard store compared under churn: open returns a
// fresh one and a function reporting its hits, misses and sweeps (NaN if it
// has none).
type churnStore struct {
	name string
	open func() (lookupFunc, func() (hits, misses uint64, sweeps float64))
}

// churnStores returns scope.For, and otter's Get with a loader building the
// guard the same way (one Compiled policy), which is what a user would
// otherwise pick.
func churnStores() []churnStore {
	compiled, err := policy.Compile(policy.Default())
	if err != nil {
		panic(err)
	}
	return []churnStore{
		{"scope.For", func() (lookupFunc, func() (uint64, uint64, float64)) {
			s := scope.New(policy.Default(), scope.Options[string]{MaxKeys: 1024})
			return func(k string) (*policy.Guard, time.Duration, bool) {
					_, hit := s.Peek(k) // neither counts nor keeps the key
					t := time.Now()
					g := s.For(k)
					return g, time.Since(t), hit
				}, func() (uint64, uint64, float64) {
					st := s.Stats()
					return st.Hits, st.Misses, float64(st.Sweeps)
				}
		}},
		{"otter.Get", func() (lookupFunc, func() (uint64, uint64, float64)) {
			c := otter.Must(&otter.Options[string, *policy.Guard]{MaximumSize: 1024, InitialCapacity: 1024})
			var misses, calls atomic.Uint64
			loader := otter.LoaderFunc[string, *policy.Guard](func(context.Context, string) (*policy.Guard, error) {
				misses.Add(1)
				return compiled.New(), nil
			})
			ctx := context.Background()
			return func(k string) (*policy.Guard, time.Duration, bool) {
					calls.Add(1)
					m := misses.Load()
					t := time.Now()
					g, _ := c.Get(ctx, k, loader)
					took := time.Since(t)
					return g, took, misses.Load() == m
				}, func() (uint64, uint64, float64) {
					m := misses.Load()
					return calls.Load() - m, m, math.NaN()
				}
		}},
	}
}

// latencies is the latency histogram of all lookups, of those that found
// their key, and of those that did not.
type latencies struct{ all, hits, misses hist }

func (l *latencies) add(d time.Duration, hit bool) {
	l.all.add(d)
	if hit {
		l.hits.add(d)
	} else {
		l.misses.add(d)
	}
}

func (l *latencies) merge(o *latencies) {
	l.all.merge(&o.all)
	l.hits.merge(&o.hits)
	l.misses.merge(&o.misses)
}

// warmPasses is how many times warmUp runs the key sequence: the heap
// reaches its steady size only over several collections, and a pass of
// scope.For allocates about one collection's worth of entries.
const warmPasses = 4

// warmUp runs the whole key sequence warmPasses times through lookup,
// untimed, so that the store is full and evicting and the Go heap has grown
// to its steady size before anything is measured: the growth of the heap
// faults in fresh pages (microseconds each on a VM), a start-up cost that is
// not the latency under churn. The rows report the page faults of the timed
// loop (faults), to show that it is past them. It returns stats counting
// from the end of the warm-up.
func warmUp(lookup lookupFunc, stats func() (uint64, uint64, float64), keys *packed, seq []int32) func() (uint64, uint64, float64) {
	for range warmPasses {
		for _, k := range seq {
			lookup(keys.at(k))
		}
	}
	h0, m0, s0 := stats()
	return func() (uint64, uint64, float64) {
		h, m, sw := stats()
		return h - h0, m - m0, sw - s0
	}
}

func churn(b *testing.B, keys *packed, seq []int32) {
	report := func(b *testing.B, l *latencies, stats func() (uint64, uint64, float64)) {
		p50, p999 := l.all.quantile(0.5), l.all.quantile(0.999)
		hits, misses, sweeps := stats()
		b.ReportMetric(p50, "p50-ns")
		b.ReportMetric(l.all.quantile(0.99), "p99-ns")
		b.ReportMetric(p999, "p99.9-ns")
		b.ReportMetric(p999/p50, "p99.9/p50")
		b.ReportMetric(l.hits.quantile(0.5), "hit-p50-ns")
		b.ReportMetric(l.hits.quantile(0.999), "hit-p99.9-ns")
		b.ReportMetric(l.misses.quantile(0.5), "miss-p50-ns")
		b.ReportMetric(l.misses.quantile(0.99), "miss-p99-ns")
		b.ReportMetric(float64(hits)/float64(hits+misses), "hit-ratio")
		if !math.IsNaN(sweeps) {
			b.ReportMetric(sweeps, "sweeps")
		}
	}
	for _, store := range churnStores() {
		b.Run(store.name+"/serial", func(b *testing.B) {
			lookup, stats := store.open()
			stats = warmUp(lookup, stats, keys, seq)
			spin := spinLike(lookup, keys, seq)
			l, floor := new(latencies), new(hist)
			b.ReportAllocs()
			cpu, faults := cputime.Process(), cputime.Faults()
			i := 0
			for b.Loop() {
				g, took, hit := lookup(keys.at(seq[i]))
				l.add(took, hit)
				if g == nil {
					b.Fatal("nil guard")
				}
				if i++; i == len(seq) {
					i = 0
				}
			}
			b.StopTimer()
			reportCPU(b, cpu)
			b.ReportMetric(float64(cputime.Faults()-faults), "faults")
			report(b, l, stats)
			for range max(b.N/floorEvery, 1) {
				floor.add(spin())
			}
			b.ReportMetric(floor.quantile(0.5), "floor-p50-ns")
			b.ReportMetric(floor.quantile(0.999), "floor-p99.9-ns")
		})
		b.Run(store.name+"/parallel", func(b *testing.B) {
			lookup, stats := store.open()
			stats = warmUp(lookup, stats, keys, seq)
			b.ResetTimer()
			var mu sync.Mutex
			total := new(latencies)
			next := 0
			b.ReportAllocs()
			cpu, faults := cputime.Process(), cputime.Faults()
			b.RunParallel(func(pb *testing.PB) {
				mu.Lock()
				i := next * (len(seq) / 8)
				next++
				mu.Unlock()
				l := new(latencies)
				for pb.Next() {
					g, took, hit := lookup(keys.at(seq[i%len(seq)]))
					l.add(took, hit)
					if g == nil {
						panic("nil guard")
					}
					i++
				}
				mu.Lock()
				total.merge(l)
				mu.Unlock()
			})
			b.StopTimer()
			reportCPU(b, cpu)
			b.ReportMetric(float64(cputime.Faults()-faults), "faults")
			report(b, total, stats)
		})
	}
}

// A serial churn row times its spin loop (see spinLike) once for every
// floorEvery lookups it timed, right after them.
const floorEvery = 4

// spinSink keeps the spin loop's work.
var spinSink uint64

// spinLike returns a loop of pure computation, touching no memory, that
// takes about as long as lookup's median miss, and times it as the churn
// rows time a lookup. Its p99.9 (floor-p99.9-ns) is what the host and the
// runtime alone do to an operation of a miss's length: on a VM whose vCPUs
// are interrupted or descheduled, a tail percentile of anything that long
// is at least that, whatever the operation does. (The host's interruptions
// come and go over minutes: a run's floor is measured right after its
// lookups.)
func spinLike(lookup lookupFunc, keys *packed, seq []int32) func() time.Duration {
	var misses hist
	for _, k := range seq[:min(len(seq), 200_000)] {
		if _, took, hit := lookup(keys.at(k)); !hit {
			misses.add(took)
		}
	}
	want := misses.quantile(0.5)
	loop := func(n int) time.Duration {
		t := time.Now()
		x := spinSink
		for i := range n {
			x = x*6364136223846793005 + uint64(i)
		}
		spinSink = x
		return time.Since(t)
	}
	// The loop's median over a few hundred runs, per length, until it is
	// at least the miss median.
	n := 1
	for ; n < 1<<20; n *= 2 {
		var h hist
		for range 301 {
			h.add(loop(n))
		}
		if h.quantile(0.5) >= want {
			break
		}
	}
	return func() time.Duration { return loop(n) }
}

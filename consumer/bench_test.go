package consumer_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/cputime"
	"github.com/ringfence/ringfence/internal/stripecount"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// batchSource delivers prepared messages spread over partitions and
// tenants, in batches of batch per partition (as a Kafka fetch does),
// honouring Pause, and reports when all are settled. Settles are counted
// per partition (stripecount): one counter that every worker increments
// would be a line bouncing between the cores on every message, a cost
// charged to the engine, where Kafka's Settle is a no-op and NATS's queues
// an ack.
type batchSource struct {
	msgs    []consumer.Message
	parts   int
	batch   int
	settled *stripecount.Counts // per partition

	mu     sync.Mutex
	cond   *sync.Cond
	paused map[int32]bool

	// warm is how many of msgs come first, to be settled before the
	// measurement starts (see withWarmUp); the rest wait for gate.
	warm int
	gate chan struct{}
}

func newBatchSource(n, parts, tenants, batch int) *batchSource {
	return newKeyedSource(n, parts, batch, roundRobin(tenants))
}

// tenantPick returns the tenant of the i-th message.
type tenantPick func(i int) int

// roundRobin spreads the messages over tenants in turn: every tenant is
// seen once per tenants messages, the worst case for the engine's tenant
// and lane state (nothing stays hot).
func roundRobin(tenants int) tenantPick { return func(i int) int { return i % tenants } }

// zipf draws the tenants from a Zipf distribution of exponent s over
// tenants keys (seeded: every run sees the same stream): a few hot
// tenants and a long tail seen once, as keyed traffic usually is.
func zipf(s float64, tenants int) tenantPick {
	z := rand.NewZipf(rand.New(rand.NewSource(1)), s, 1, uint64(tenants-1))
	return func(int) int { return int(z.Uint64()) }
}

// withWarmUp returns a source of warm-up messages, then n messages picked
// by pick. The warm-up is one message of each of tenants tenants in turn,
// and as many more as it takes to feed every partition two batches (the
// tenants again, in turn): the engine has seen every tenant and made every
// partition's state (its lane table, and lanes past its bound when the
// partitions are many) before the measurement (see benchEngine), which then
// measures the cost of a message in steady state, not that of a tenant's or
// a partition's first sight (the distinct-keys row measures the first).
func withWarmUp(n, parts, batch, tenants int, pick tenantPick) *batchSource {
	warm := max(tenants, 2*parts*batch)
	s := newKeyedSource(warm+n, parts, batch, func(i int) int {
		if i < warm {
			return i % tenants
		}
		return pick(i - warm)
	})
	s.warm, s.gate = warm, make(chan struct{})
	return s
}

// tenantKey is the key of the t-th tenant of a benchmark's messages.
func tenantKey(t int) string { return fmt.Sprintf("tenant-%04d", t) }

func newKeyedSource(n, parts, batch int, pick tenantPick) *batchSource {
	s := &batchSource{msgs: make([]consumer.Message, n), parts: parts, batch: batch, paused: map[int32]bool{}}
	s.cond = sync.NewCond(&s.mu)
	keys := map[int][]byte{}
	offs := make([]int64, parts)
	for i := range s.msgs {
		p := (i / batch) % parts
		t := pick(i)
		k, ok := keys[t]
		if !ok {
			k = []byte(tenantKey(t))
			keys[t] = k
		}
		s.msgs[i] = consumer.Message{Key: k, Topic: "t", Partition: consumer.Partition{Topic: "t", ID: int32(p)}, Offset: offs[p]}
		offs[p]++
	}
	s.settled = stripecount.New(offs) // offs[p]: the messages of partition p
	return s
}

// settledCount is how many messages were settled so far.
func (s *batchSource) settledCount() int64 { return s.settled.Total() }

// done is closed once every message was settled.
func (s *batchSource) done() <-chan struct{} { return s.settled.Done() }

func (s *batchSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	for p := range s.parts {
		d.Assigned(consumer.Partition{Topic: "t", ID: int32(p)})
	}
	batch := make([]*consumer.Message, 0, s.batch)
	for i := 0; i < len(s.msgs); {
		if i == s.warm && s.gate != nil {
			select {
			case <-s.gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		p := s.msgs[i].Partition.ID
		s.mu.Lock()
		for s.paused[p] {
			s.cond.Wait()
		}
		s.mu.Unlock()
		batch = batch[:0]
		end := len(s.msgs)
		if i < s.warm {
			end = s.warm // a batch never mixes the warm-up and the measured messages
		}
		for ; i < end && len(batch) < s.batch && s.msgs[i].Partition.ID == p; i++ {
			batch = append(batch, &s.msgs[i])
		}
		d.DeliverBatch(batch)
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *batchSource) Settle(ctx context.Context, m *consumer.Message) error {
	s.settled.Add(int(m.Partition.ID))
	return nil
}

func (s *batchSource) Commit(context.Context, consumer.Partition, int64) error { return nil }

func (s *batchSource) Pause(p consumer.Partition) {
	s.mu.Lock()
	s.paused[p.ID] = true
	s.mu.Unlock()
}

func (s *batchSource) Resume(p consumer.Partition) {
	s.mu.Lock()
	s.paused[p.ID] = false
	s.cond.Broadcast()
	s.mu.Unlock()
}

// BenchmarkEngine measures the engine's overhead per message with a no-op
// handler: delivery in batches, lane scheduling, the tenant's guard
// (breaker, budget, latency estimate, slow-call check, bulkhead), settle
// and watermark commit. ns/op and allocs/op are per message. The messages
// are prepared before the timer starts and the garbage collector is off
// while it runs, so that it measures the engine rather than the collector
// scanning b.N prepared messages. cpu-ns/op is the process's CPU time per
// message over the same span (the source's delivery loop included): ns/op
// is wall time on however many cores the engine kept busy. faults/kmsg is
// the process's page faults per 1000 messages over that span: with the
// collector off, memory the engine allocates is never reused, and each
// page of it is faulted in (on a VM, microseconds a fault), a cost that a
// row allocating per message pays only then. xcore-ns and miss-ns, measured
// after each row, are what a cache line costs the host right now when it
// crosses between the cores (cputime.RoundTrip) and when it comes from
// memory (cputime.MemoryMiss): the 1000-tenant row pays mostly the first,
// the rows of many tenants the second too, for the state of each tenant
// they meet.
//
// Each row runs twice: with the collector off, and with it on (gc=on), as
// users run the engine: the collector's share is what the engine's state
// per tenant and lane costs it. The rows of many tenants (round-robin, so
// each is seen rarely, and Zipf over a million keys, most seen once) and
// of many partitions (a lane per tenant per partition) show whether the
// cost of a message stays flat in the tenants and lanes the engine tracks.
// The row of 1,000 tenants (the one the others are compared with), the
// rows of 10,000 and 100,000 tenants (round-robin, and Zipf over 100,000)
// and the row of 512 partitions start with every tenant seen once and
// every partition fed, before the measurement (see withWarmUp): with
// 100,000 tenants and a few hundred thousand messages, a third of them
// would otherwise be a tenant's first, and over 512 partitions the
// one-time making of each partition's lanes would be most of what a
// message costs. The Zipf row over 1,000,000 keys does not: most of its
// keys are seen once, first sights included. The first sight of a tenant
// is the distinct-keys row: every message a key never seen before, with
// the default Config (the scope keeps 1024 guards, the engine as many idle
// tenants), the cost of a stream of keys each seen once.
func BenchmarkEngine(b *testing.B) {
	for _, bc := range []struct {
		tenants, parts, concurrency int
		zipf                        float64 // > 0: tenants drawn by Zipf(s), else round-robin
		distinct                    bool    // every message a new tenant, default Config
		warm                        bool    // every tenant and partition seen before the timer (withWarmUp)
	}{
		{tenants: 1, parts: 1, concurrency: 1},
		{tenants: 1, parts: 4, concurrency: 4},
		{tenants: 100, parts: 4, concurrency: 8},
		{tenants: 1000, parts: 4, concurrency: 64, warm: true},
		{tenants: 10000, parts: 4, concurrency: 64, warm: true},
		{tenants: 100000, parts: 4, concurrency: 64, warm: true},
		{tenants: 100000, parts: 4, concurrency: 64, zipf: 1.1, warm: true},
		{tenants: 1000000, parts: 4, concurrency: 64, zipf: 1.1},
		{tenants: 1000, parts: 512, concurrency: 64, warm: true},
		{parts: 4, concurrency: 64, distinct: true},
	} {
		name := fmt.Sprintf("tenants=%d/partitions=%d/concurrency=%d", bc.tenants, bc.parts, bc.concurrency)
		pick := roundRobin(max(bc.tenants, 1))
		switch {
		case bc.zipf > 0:
			name = fmt.Sprintf("tenants=%d/zipf=%g/partitions=%d/concurrency=%d", bc.tenants, bc.zipf, bc.parts, bc.concurrency)
		case bc.distinct:
			name = fmt.Sprintf("tenants=distinct/partitions=%d/concurrency=%d", bc.parts, bc.concurrency)
			pick = func(i int) int { return i }
		}
		for _, gc := range []bool{false, true} {
			row := name
			if gc {
				row += "/gc=on"
			}
			b.Run(row, func(b *testing.B) {
				if bc.zipf > 0 {
					pick = zipf(bc.zipf, bc.tenants)
				}
				var src *batchSource
				if bc.warm {
					src = withWarmUp(b.N, bc.parts, 64, bc.tenants, pick)
				} else {
					src = newKeyedSource(b.N, bc.parts, 64, pick)
				}
				benchEngine(b, src, bc.tenants, bc.concurrency, gc, consumer.Tracing{})
			})
		}
	}
}

// BenchmarkTenantPipeline is a reference for BenchmarkEngine's rows of
// many tenants: what a message costs in a pipeline that does nothing but
// keep state per tenant, over the same messages as the engine row of the
// same tenants. The goroutine that delivers looks each message's tenant up
// in a map and hands each batch to one of GOMAXPROCS workers over a
// channel; the worker loads the guard lines of the batch's tenants
// (policy.Guard.Prefetch) and calls each guard, Allow then Done. No lane,
// bound, settle or commit. With order=tenant it also keeps each tenant's
// order, the least an engine of ordered tenants does: the delivering
// goroutine counts the message into its tenant's queue (under the tenant's
// mutex; a count, the messages themselves are not kept) and hands the
// tenant over only if no worker holds it, and a worker handles what the
// queue holds until it finds it empty. Every
// tenant and its guard (in a scope of twice the tenants, as the engine
// row's) is made before the timer starts, and the collector is off. What a
// message costs at 100,000 tenants beyond its cost at 1,000 is what the
// tenants' state costs when the caches cannot hold it; the engine row's
// cost beyond that is the engine's own. From consumer/:
//
//	go test -run '^$' -bench 'BenchmarkEngine/^tenants=(1000|100000)$/partitions=4/concurrency=64$|TenantPipeline' -benchtime 1000000x
func BenchmarkTenantPipeline(b *testing.B) {
	for _, ordered := range []bool{false, true} {
		for _, bc := range []struct {
			tenants int
			zipf    float64
		}{{tenants: 1000}, {tenants: 100000}, {tenants: 100000, zipf: 1.1}} {
			name := fmt.Sprintf("tenants=%d", bc.tenants)
			pick := roundRobin(bc.tenants)
			if bc.zipf > 0 {
				name = fmt.Sprintf("tenants=%d/zipf=%g", bc.tenants, bc.zipf)
			}
			order := "none"
			if ordered {
				order = "tenant"
			}
			b.Run(fmt.Sprintf("order=%s/%s/partitions=4", order, name), func(b *testing.B) {
				if bc.zipf > 0 {
					pick = zipf(bc.zipf, bc.tenants)
				}
				src := newKeyedSource(b.N, 4, 64, pick)
				tenantPipeline(b, src.msgs, bc.tenants, src.batch, ordered)
			})
		}
	}
}

// pipelineTenant is a tenant of tenantPipeline.
type pipelineTenant struct {
	g       *policy.Guard
	handled atomic.Uint64
	mu      sync.Mutex
	q       int  // messages queued (order=tenant)
	held    bool // a batch or a worker holds it (order=tenant)
	// Pads it to 64 bytes, a line of its own, as the engine's tenant
	// starts one: two workers' tenants never share a line.
	_ [24]byte
}

// run handles the messages of t that wait (order=tenant): one call each,
// until it finds none, then lets t go.
func (t *pipelineTenant) run(ctx context.Context) (refused int64) {
	t.mu.Lock()
	for n := t.q; n > 0; n = t.q {
		t.q = 0
		t.mu.Unlock()
		for range n {
			refused += t.call(ctx)
		}
		t.mu.Lock()
	}
	t.held = false
	t.mu.Unlock()
	return refused
}

// call calls t's guard once, as a successful message does.
func (t *pipelineTenant) call(ctx context.Context) (refused int64) {
	pm, err := t.g.Allow(ctx)
	if err != nil {
		return 1
	}
	pm.Done(nil)
	t.handled.Add(1)
	return 0
}

// tenantPipeline runs ms, whose keys are those of n tenants (tenantKey),
// through the pipeline BenchmarkTenantPipeline describes, batch messages
// at a time.
func tenantPipeline(b *testing.B, ms []consumer.Message, n, batch int, ordered bool) {
	p := policy.Default()
	p.AttemptTimeout = 0 // as the engine rows
	sc := scope.New(p, scope.Options[string]{MaxKeys: 2 * n})
	tenants := make(map[string]*pipelineTenant, n)
	for t := range n {
		k := tenantKey(t)
		tenants[k] = &pipelineTenant{g: sc.Pin(k)}
	}
	ctx := context.Background()
	work := make(chan []*pipelineTenant, 8)
	free := make(chan []*pipelineTenant, 16)
	for range cap(free) {
		free <- make([]*pipelineTenant, 0, batch)
	}
	var wg sync.WaitGroup
	var refused atomic.Int64
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for ts := range work {
				for _, t := range ts {
					t.g.Prefetch()
				}
				for _, t := range ts {
					if ordered {
						refused.Add(t.run(ctx))
					} else {
						refused.Add(t.call(ctx))
					}
				}
				free <- ts[:0]
			}
		})
	}
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	b.ReportAllocs()
	b.ResetTimer()
	for rest := ms; len(rest) > 0; {
		k := min(batch, len(rest))
		ts := <-free
		for i := range rest[:k] {
			t := tenants[string(rest[i].Key)]
			if !ordered {
				ts = append(ts, t)
				continue
			}
			t.mu.Lock()
			t.q++
			if !t.held {
				t.held = true
				ts = append(ts, t)
			}
			t.mu.Unlock()
		}
		work <- ts
		rest = rest[k:]
	}
	close(work)
	wg.Wait()
	b.StopTimer()
	var handled uint64
	for _, t := range tenants {
		handled += t.handled.Load()
	}
	if refused.Load() > 0 || handled != uint64(len(ms)) {
		b.Fatalf("%d calls refused, %d handled of %d", refused.Load(), handled, len(ms))
	}
}

// engineProfile is a file name prefix: each benchEngine row then writes a
// CPU profile of its measured span alone to prefix.<row>, leaving out the
// preparation of its messages and the warm-up of its tenants, which
// -cpuprofile includes (with 100,000 tenants the warm-up builds 100,000
// guards, whose samples a whole-run profile mixes with the messages'). To
// read where a message costs more at 100,000 tenants than at 1,000, from
// consumer/:
//
//	go test -run '^$' -bench 'BenchmarkEngine/^tenants=(1000|100000)$/partitions=4/concurrency=64$' -benchtime 2000000x -engine.cpuprofile /tmp/engine
//	go tool pprof -top -diff_base '/tmp/engine.tenants=1000_partitions=4_concurrency=64' consumer.test '/tmp/engine.tenants=100000_partitions=4_concurrency=64'
var engineProfile = flag.String("engine.cpuprofile", "", "BenchmarkEngine: write a CPU profile of each row's measured span to this prefix plus the row's name")

// profileMeasured starts the CPU profile of b's measured span if
// -engine.cpuprofile is set, and returns the function that stops it (once:
// later calls do nothing, so that a deferred call covers a row that fails).
func profileMeasured(b *testing.B) (stop func()) {
	if *engineProfile == "" {
		return func() {}
	}
	row := b.Name()
	row = row[strings.IndexByte(row, '/')+1:]
	name := *engineProfile + "." + strings.NewReplacer("/", "_", " ", "_").Replace(row)
	f, err := os.Create(name)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.Fatal(err)
	}
	stopped := false
	return func() {
		if stopped {
			return
		}
		stopped = true
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
		b.Logf("CPU profile of the measured span: %s", name)
	}
}

// BenchmarkEngineTracing is BenchmarkEngine's first and third rows with
// tracing: none configured, an SDK that samples nothing, and one that
// records every span (and discards it as it ends).
func BenchmarkEngineTracing(b *testing.B) {
	for _, tc := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{
		{"none", nil},
		{"always-off", sdktrace.NeverSample()},
		{"always-on", sdktrace.AlwaysSample()},
	} {
		for _, bc := range []struct{ tenants, parts, concurrency int }{{1, 1, 1}, {100, 4, 8}} {
			b.Run(fmt.Sprintf("tracing=%s/tenants=%d/partitions=%d/concurrency=%d", tc.name, bc.tenants, bc.parts, bc.concurrency), func(b *testing.B) {
				var tr consumer.Tracing
				if tc.sampler != nil {
					tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(tc.sampler), sdktrace.WithSpanProcessor(discardSpans{}))
					defer func() { _ = tp.Shutdown(context.Background()) }()
					tr.Provider = tp
				}
				benchEngine(b, newBatchSource(b.N, bc.parts, bc.tenants, 64), bc.tenants, bc.concurrency, false, tr)
			})
		}
	}
}

// discardSpans is a span processor that drops every span.
type discardSpans struct{}

func (discardSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discardSpans) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discardSpans) Shutdown(context.Context) error                  { return nil }
func (discardSpans) ForceFlush(context.Context) error                { return nil }

// benchEngine runs src's messages through an engine of concurrency workers
// and a handler that succeeds, with the collector off unless gc. The scope
// keeps 2*tenants guards; tenants 0 means the default (1024).
func benchEngine(b *testing.B, src *batchSource, tenants, concurrency int, gc bool, tr consumer.Tracing) {
	p := policy.Default()
	p.AttemptTimeout = 0 // measure the engine, not the guard's attempt timer (reported separately)
	c, err := consumer.New(consumer.Config{
		Scope:       scope.New(p, scope.Options[string]{MaxKeys: 2 * tenants}),
		Handler:     consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
		Tenant:      consumer.FromKey(),
		DLQ:         dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil }),
		Concurrency: concurrency,
		// The bulkhead is the workers here: one tenant may use them all.
		TenantConcurrency: concurrency,
		Tracing:           tr,
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	b.ReportAllocs()
	runtime.GC()
	if src.warm > 0 {
		go func() { errc <- c.Run(ctx, src) }()
		// Every tenant seen once, then the measurement.
		deadline := time.Now().Add(10 * time.Minute)
		for src.settledCount() < int64(src.warm) {
			if time.Now().After(deadline) {
				b.Fatal("the warm-up did not settle")
			}
			time.Sleep(time.Millisecond)
		}
		runtime.GC()
	}
	if !gc {
		defer debug.SetGCPercent(debug.SetGCPercent(-1))
	}
	b.ResetTimer()
	stopProfile := profileMeasured(b)
	defer stopProfile()
	cpu0, faults0 := cputime.Process(), cputime.Faults()
	if src.gate != nil {
		close(src.gate)
	} else {
		go func() { errc <- c.Run(ctx, src) }()
	}
	select {
	case <-src.done():
	case <-time.After(10 * time.Minute):
		b.Fatal("not every message settled")
	}
	b.StopTimer()
	stopProfile()
	b.ReportMetric(float64(cputime.Process()-cpu0)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(1000*float64(cputime.Faults()-faults0)/float64(b.N), "faults/kmsg")
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(cputime.RoundTrip(5, 20000)), "xcore-ns")
	// What a line of a tenant's state costs when the caches cannot hold
	// it: the rows of many tenants are the 1000-tenant row plus such misses.
	b.ReportMetric(float64(cputime.MemoryMiss(500000)), "miss-ns")
}

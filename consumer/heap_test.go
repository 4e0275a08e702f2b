package consumer_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// keySource delivers messages of the tenant keys it is given, one phase
// at a time: key i goes to partition i%parts (a tenant lives on one
// partition, as with Kafka's key partitioning), in batches of keyBatch
// messages of one partition, as a fetch does. It honours Pause and counts
// settles. Each batch is allocated as it is delivered, so the messages are
// garbage once settled: the heap it leaves is the engine's.
type keySource struct {
	parts   int
	phases  chan [2]int // key range [from, to) of a phase
	settled atomic.Int64
	d       atomic.Pointer[consumer.Dispatcher] // set when Run starts

	mu     sync.Mutex
	cond   *sync.Cond
	paused map[int32]bool
}

const keyBatch = 64

func newKeySource(parts int) *keySource {
	s := &keySource{parts: parts, phases: make(chan [2]int), paused: map[int32]bool{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func heapKey(i int) string { return fmt.Sprintf("tenant-%09d", i) }

func (s *keySource) Run(ctx context.Context, d consumer.Dispatcher) error {
	s.d.Store(&d)
	offs := make([]int64, s.parts)
	for p := range s.parts {
		d.Assigned(consumer.Partition{Topic: "t", ID: int32(p)})
	}
	for {
		var r [2]int
		select {
		case <-ctx.Done():
			return ctx.Err()
		case r = <-s.phases:
		}
		for p := range s.parts {
			// Keys from, from+parts, ... of partition p.
			first := r[0] + (p-r[0]%s.parts+s.parts)%s.parts
			for i := first; i < r[1]; {
				s.mu.Lock()
				for s.paused[int32(p)] {
					s.cond.Wait()
				}
				s.mu.Unlock()
				ms := make([]consumer.Message, 0, keyBatch)
				for ; i < r[1] && len(ms) < keyBatch; i += s.parts {
					ms = append(ms, consumer.Message{
						Key:       []byte(heapKey(i)),
						Topic:     "t",
						Partition: consumer.Partition{Topic: "t", ID: int32(p)},
						Offset:    offs[p],
					})
					offs[p]++
				}
				batch := make([]*consumer.Message, len(ms))
				for j := range ms {
					batch[j] = &ms[j]
				}
				d.DeliverBatch(batch)
			}
		}
	}
}

func (s *keySource) Settle(context.Context, *consumer.Message) error {
	s.settled.Add(1)
	return nil
}

func (s *keySource) Commit(context.Context, consumer.Partition, int64) error { return nil }

func (s *keySource) Pause(p consumer.Partition) {
	s.mu.Lock()
	s.paused[p.ID] = true
	s.mu.Unlock()
}

func (s *keySource) Resume(p consumer.Partition) {
	s.mu.Lock()
	s.paused[p.ID] = false
	s.cond.Broadcast()
	s.mu.Unlock()
}

// liveHeap is the live heap after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

const mib = 1 << 20

// heapRun is an engine fed by a keySource, for measuring what it keeps.
type heapRun struct {
	c      *consumer.Consumer
	src    *keySource
	base   uint64 // live heap before the engine was made
	sent   int64
	cancel context.CancelFunc
	done   chan error
}

func startHeapRun(t *testing.T, parts int, cfg consumer.Config) *heapRun {
	t.Helper()
	r := &heapRun{src: newKeySource(parts), done: make(chan error, 1)}
	r.base = liveHeap()
	cfg.Handler = consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil })
	cfg.Tenant = consumer.FromKey()
	cfg.DLQ = dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil })
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.c = c
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- c.Run(ctx, r.src) }()
	t.Cleanup(func() {
		r.cancel()
		if err := <-r.done; err != nil {
			t.Error(err)
		}
	})
	return r
}

// feed delivers keys [from, to) and waits until every message sent so far
// is settled (bounded).
func (r *heapRun) feed(t *testing.T, from, to int) {
	t.Helper()
	r.src.phases <- [2]int{from, to}
	r.sent += int64(to - from)
	deadline := time.Now().Add(10 * time.Minute)
	for r.src.settled.Load() < r.sent {
		if time.Now().After(deadline) {
			t.Fatalf("settled %d of %d messages", r.src.settled.Load(), r.sent)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// grown is the live heap now, minus the heap before the engine was made.
func (r *heapRun) grown() int64 { return int64(liveHeap()) - int64(r.base) }

// tracked is what the engine holds state for.
func (r *heapRun) tracked() consumer.TrackedStats { return r.c.Stats().Tracked }

// settleTracking waits (bounded) until the engine's sweeps brought its
// lanes back to their bound now that every message is settled, and
// returns what it tracks.
func (r *heapRun) settleTracking(t *testing.T, parts int) consumer.TrackedStats {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		tr := r.tracked()
		if tr.Lanes <= parts*tr.MaxIdle || time.Now().After(deadline) {
			return tr
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEngineHeap streams tenant keys through an engine, one message each,
// in two phases, and checks after each, while the engine runs, what it
// still tracks (at most MaxIdleTenants idle tenants and MaxIdleTenants
// lanes a partition, once every message is settled) and its live heap
// (after a full collection, minus the heap before the engine was made),
// which must not grow with the second phase. By default it runs 24,000
// keys a phase (8,000 with -short) with MaxIdleTenants 64 (and MaxQueuedPerPartition 1000),
// half of the second phase's keys coming back after they were forgotten. RINGFENCE_HEAP_TENANTS=n runs n
// distinct keys a phase with the default config instead, and logs the
// figures (1000000: the figure the package doc's bound is checked
// against); RINGFENCE_HEAP_PARTITIONS sets the partitions (4).
func TestEngineHeap(t *testing.T) {
	parts := 4
	if v, _ := strconv.Atoi(os.Getenv("RINGFENCE_HEAP_PARTITIONS")); v > 0 {
		parts = v
	}
	n, _ := strconv.Atoi(os.Getenv("RINGFENCE_HEAP_TENANTS"))
	cfg := consumer.Config{}
	second := [2]int{n, 2 * n} // the second phase's keys: all new
	maxHeap, maxGrowth := int64(64*mib), int64(8*mib)
	if n <= 0 {
		n = 24000
		if testing.Short() {
			n = 8000
		}
		cfg.MaxIdleTenants = 64
		cfg.MaxQueuedPerPartition = 1000 // busy lanes, tracked whatever the bound, stay few
		second = [2]int{n / 2, n + n/2}  // half of them come back
		maxHeap, maxGrowth = 12*mib, 3*mib
	}
	r := startHeapRun(t, parts, cfg)
	var first int64
	for phase, keys := range [][2]int{{0, n}, second} {
		r.feed(t, keys[0], keys[1])
		tr := r.settleTracking(t, parts)
		grown := r.grown()
		t.Logf("after phase %d (keys %d to %d, partitions=%d): live heap +%.1f MiB, %d tenants tracked (%d idle, %d lanes), %d forgotten",
			phase+1, keys[0], keys[1], parts, float64(grown)/mib, tr.Tenants, tr.Idle, tr.Lanes, tr.Forgotten)
		if tr.Idle > tr.MaxIdle || tr.Lanes > parts*tr.MaxIdle || tr.Tenants > tr.Idle+tr.Lanes {
			t.Errorf("phase %d: tracking %+v, want at most MaxIdle idle tenants and MaxIdle lanes a partition", phase+1, tr)
		}
		if want := uint64(keys[1]) - uint64(tr.Tenants); phase == 0 && tr.Forgotten < want {
			t.Errorf("phase 1: %d tenants forgotten, want %d", tr.Forgotten, want)
		}
		if grown > maxHeap {
			t.Errorf("phase %d: the engine's live heap grew by %.1f MiB, want at most %.0f", phase+1, float64(grown)/mib, float64(maxHeap)/mib)
		}
		if phase == 0 {
			first = grown
		} else if grown-first > maxGrowth {
			t.Errorf("the second phase grew the live heap from %.1f to %.1f MiB", float64(first)/mib, float64(grown)/mib)
		}
	}
	if err := consumer.CheckInvariants(r.c); err != nil {
		t.Error(err)
	}
}

// TestManyTenantsComeBackInBatches: with more tenants tracked than
// WarmTenants, the runs of a fetch are queued after a pass that loads
// their lanes', tenants' and the sweep's next lanes' lines ahead
// (warmRun). Keys delivered in batches of keyBatch, then all again, then
// new ones: every message is handled once, a key that comes back finds its
// own tenant (none is made twice), and the engine's invariants hold. Once
// with every tenant kept, and once on one partition with MaxIdleTenants at
// WarmTenants, where each lane made sweeps the oldest.
func TestManyTenantsComeBackInBatches(t *testing.T) {
	const n = consumer.WarmTenants + 2000
	for _, tc := range []struct {
		name           string
		parts, maxIdle int
		keep           bool // every tenant stays tracked
	}{
		{"kept", 4, 2 * n, true},
		{"swept", 1, consumer.WarmTenants, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			handled := map[string]int{}
			src := newKeySource(tc.parts)
			c := startWith(t, consumer.Config{
				Scope:          scope.New(fastPolicy(), scope.Options[string]{MaxKeys: 2 * n}),
				MaxIdleTenants: tc.maxIdle,
				Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
					mu.Lock()
					handled[string(m.Key)]++
					mu.Unlock()
					return nil
				}),
			}, src)
			sent := int64(0)
			for phase, keys := range [][2]int{{0, n}, {0, n}, {n, n + n/4}} {
				src.phases <- keys
				sent += int64(keys[1] - keys[0])
				consumertest.Eventually(t, "every message settled", func() bool { return src.settled.Load() >= sent })
				if got := src.settled.Load(); got != sent {
					t.Fatalf("phase %d: %d settles, want %d", phase+1, got, sent)
				}
				tr := c.Stats().Tracked
				switch {
				case tc.keep && (tr.Tenants != keys[1] || tr.Forgotten != 0):
					t.Fatalf("phase %d: %d tenants tracked, %d forgotten; want %d and none", phase+1, tr.Tenants, tr.Forgotten, keys[1])
				case !tc.keep && (tr.Tenants > 2*tc.maxIdle+1 || tr.Tenants < consumer.WarmTenants || tr.Lanes > tr.MaxLanes):
					// More keys than MaxLanes: lanes were swept.
					t.Fatalf("phase %d: %d tenants tracked, %d lanes; want %d to %d tenants and at most %d lanes", phase+1, tr.Tenants, tr.Lanes, consumer.WarmTenants, 2*tc.maxIdle+1, tr.MaxLanes)
				}
				if err := consumer.CheckInvariants(c); err != nil {
					t.Fatalf("phase %d: %v", phase+1, err)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for i := range n + n/4 {
				want := 1
				if i < n {
					want = 2
				}
				if got := handled[heapKey(i)]; got != want {
					t.Fatalf("%s handled %d times, want %d", heapKey(i), got, want)
				}
			}
		})
	}
}

// TestIdleTenantBytes measures what the engine keeps for a tenant once it
// is idle (its guard in the scope included, which the tenant's pin keeps
// there), and for each lane on top, for Config.MaxIdleTenants's doc: n
// tenants of one message each on one partition that keeps n lanes, then
// the partition revoked, which leaves the n tenants idle.
func TestIdleTenantBytes(t *testing.T) {
	const n = 4096
	cfg := consumer.Config{
		Scope:          scope.New(policy.Default(), scope.Options[string]{MaxKeys: n}),
		MaxIdleTenants: n,
	}
	r := startHeapRun(t, 1, cfg)
	r.feed(t, 0, n)
	withLanes := r.grown()
	if tr := r.tracked(); tr.Tenants != n || tr.Lanes != n {
		t.Fatalf("tracking %+v, want %d tenants with a lane each", tr, n)
	}
	(*r.src.d.Load()).Revoked(consumer.Partition{Topic: "t", ID: 0})
	idle := r.grown()
	if tr := r.tracked(); tr.Tenants != n || tr.Idle != n || tr.Lanes != 0 {
		t.Fatalf("tracking %+v after the revocation, want %d idle tenants", tr, n)
	}
	perTenant, perLane := idle/n, (withLanes-idle)/n
	t.Logf("an idle tenant: %d bytes (its guard included); a lane: %d bytes more", perTenant, perLane)
	if perTenant > 4096 || perLane > 2048 {
		t.Errorf("an idle tenant costs %d bytes, a lane %d more: the Config.MaxIdleTenants doc says less", perTenant, perLane)
	}
}

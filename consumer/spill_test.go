package consumer_test

// Spilling. The spill cases every adapter must pass are in consumertest
// (RunSpillLog and Run's Spill cases); these are the engine's own.

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
)

// A spill log that is down when a partition is assigned holds the source's
// Assigned callback: the engine retries Pending there, before any message
// of the partition is delivered, so that each spilled tenant's order holds.
// Cancelling Run must still end it: the drain ends what waits on the
// engine's context, and the source's Run returns.
func TestRunEndsWhileSpillLogIsDownAtAssign(t *testing.T) {
	h := consumertest.NewMemHarness(2)
	h.Sp.SetDown(true)
	c, err := consumer.New(consumer.Config{
		Handler:      consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
		Tenant:       h.Tenant(),
		DLQ:          h.S,
		Spill:        h.Sp,
		DrainTimeout: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h.NewSource(t)) }()
	consumertest.Eventually(t, "Pending refused and retried", func() bool { return h.Sp.Failures() >= 2 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s of cancel while the spill log was down at assignment")
	}
}

// backlogSource assigns one partition, delivers a tenant's first message,
// and the rest of its messages while the handler holds the first (the lane
// spills them as a backlog once the first is handled). With appendIn set,
// once the spill log's Append of them has begun, it revokes the partition
// and assigns it again.
type backlogSource struct {
	first    chan struct{} // the handler holds the first message
	release  chan struct{} // the handler lets it go
	appendIn chan struct{} // an Append has begun
	revoking chan struct{} // Revoked is called
	revoked  chan struct{} // Revoked returned
	done     chan struct{} // the partition is assigned again
}

var backlogPart = consumer.Partition{Topic: "bl", ID: 0}

func (s *backlogSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	p := backlogPart
	msg := func(i int) *consumer.Message {
		return &consumer.Message{Key: []byte("a"), Value: []byte(strconv.Itoa(i)), Topic: p.Topic, Partition: p, Offset: int64(i)}
	}
	d.Assigned(p)
	d.Deliver(msg(0))
	<-s.first
	var rest []*consumer.Message
	for i := 1; i < 8; i++ {
		rest = append(rest, msg(i))
	}
	d.DeliverBatch(rest)
	close(s.release)
	if s.appendIn != nil {
		<-s.appendIn
		close(s.revoking)
		d.Revoked(p)
		close(s.revoked)
		d.Assigned(p)
		close(s.done)
	}
	<-ctx.Done()
	return nil
}

func (s *backlogSource) Settle(context.Context, *consumer.Message) error { return nil }

func (s *backlogSource) Commit(context.Context, consumer.Partition, int64) error { return nil }

func (s *backlogSource) Pause(consumer.Partition) {}

func (s *backlogSource) Resume(consumer.Partition) {}

// startBacklog runs an engine over src with spill log sp, whose handler
// holds src's first message until src lets it go.
func startBacklog(t *testing.T, src *backlogSource, sp consumer.SpillLog) *consumer.Consumer {
	t.Helper()
	var once sync.Once
	return startWith(t, consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == "0" {
				once.Do(func() { close(src.first) })
				select {
				case <-src.release:
				case <-ctx.Done():
				}
			}
			return nil
		}),
		Spill:              sp,
		MaxQueuedPerTenant: 2,
		DLQRetry:           time.Millisecond,
	}, src)
}

// heldAppendSpill is a spill log whose first Append holds until the
// partition's Revoked returned, or for a while after it was called: an
// Append still running when Revoked returned lands after the next owner
// may have listed the logs to recover, and its entries would wait, never
// committed, for the partition's next assignment.
type heldAppendSpill struct {
	*consumertest.Spill
	src     *backlogSource
	once    sync.Once
	late    atomic.Bool // an Append returned after Revoked did
	out     chan struct{}
	pending atomic.Int64
}

func (s *heldAppendSpill) Append(ctx context.Context, lane consumer.SpillLane, msgs []*consumer.Message) error {
	first := false
	s.once.Do(func() { first = true })
	if first {
		defer close(s.out)
		close(s.src.appendIn)
		<-s.src.revoking
		select {
		case <-s.src.revoked:
			s.late.Store(true)
		case <-time.After(200 * time.Millisecond):
			// Revoked waits for this call (the engine under test is right);
			// with no wait, it would have returned by now on any machine
			// but a stalled one, which only hides the fault.
		}
	}
	return s.Spill.Append(ctx, lane, msgs)
}

func (s *heldAppendSpill) Pending(ctx context.Context, p consumer.Partition) ([]consumer.SpillLane, error) {
	lanes, err := s.Spill.Pending(ctx, p)
	s.pending.Store(int64(len(lanes)))
	return lanes, err
}

// Revoked waits for the SpillLog calls of its partition's lanes in
// progress: an Append that landed after Revoked returned would be missed by
// the next owner's Pending, and its entries left uncommitted behind a
// partition whose messages were all handled.
func TestNoSpillAppendAfterRevoked(t *testing.T) {
	src := &backlogSource{
		first: make(chan struct{}), release: make(chan struct{}), appendIn: make(chan struct{}),
		revoking: make(chan struct{}), revoked: make(chan struct{}), done: make(chan struct{}),
	}
	sp := &heldAppendSpill{Spill: consumertest.NewSpill(), src: src, out: make(chan struct{})}
	startBacklog(t, src, sp)
	for _, ch := range []chan struct{}{src.done, sp.out} {
		select {
		case <-ch:
		case <-time.After(consumertest.WaitTimeout):
			t.Fatal("the partition was not revoked and assigned again, or the held Append did not return")
		}
	}
	if sp.late.Load() {
		t.Error("a spill log Append for a lane of the partition returned after its Revoked did")
	}
	if n := sp.pending.Load(); n != 1 {
		t.Errorf("Pending at the new assignment listed %d lanes, want the spilled tenant's", n)
	}
}

// failingCommitSpill is a spill log whose Commit always fails; at its
// second call it notes the engine's count of failed spill-log calls.
type failingCommitSpill struct {
	*consumertest.Spill
	c       atomic.Pointer[consumer.Consumer]
	calls   atomic.Int64
	failsAt atomic.Int64 // SpillFailures at the second call; -1 before it
}

func (s *failingCommitSpill) Commit(context.Context, consumer.SpillLane, int64) error {
	if s.calls.Add(1) == 2 {
		for s.c.Load() == nil { // the engine may not be stored yet
			runtime.Gosched()
		}
		s.failsAt.Store(int64(s.c.Load().Stats().SpillFailures))
	}
	return consumertest.ErrSpillDown
}

// A failed spill cursor commit backs the lane's spill job off, as a failed
// append or read does: a job that retried it at once would call a log that
// is down as fast as it answers, and log a warning each time.
func TestFailedSpillCommitBacksOff(t *testing.T) {
	src := &backlogSource{first: make(chan struct{}), release: make(chan struct{})}
	sp := &failingCommitSpill{Spill: consumertest.NewSpill()}
	sp.failsAt.Store(-1)
	sp.c.Store(startBacklog(t, src, sp))
	consumertest.Eventually(t, "a second spill cursor commit", func() bool { return sp.failsAt.Load() >= 0 })
	if n := sp.failsAt.Load(); n == 0 {
		t.Fatal("the spill cursor commit was called again with no back-off counted (Stats.SpillFailures 0)")
	}
}

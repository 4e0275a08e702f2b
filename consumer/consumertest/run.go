package consumertest

import (
	"context"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
)

// Running is a Source.Run started in the background by RunSource, for
// tests that expect Run to end by itself (a dead source) or not (a
// transient fault).
type Running struct {
	cancel context.CancelFunc
	done   chan error // receives Run's result once; re-filled by whoever takes it
}

// RunSource runs src.Run(ctx, d) in the background. At the end of the test
// it cancels ctx and waits (up to 30s) for Run to return; unlike
// StartSource it does not report Run's error, which the test reads with
// Ended.
func RunSource(t testing.TB, src consumer.Source, d consumer.Dispatcher) *Running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- src.Run(ctx, d) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-r.done:
			r.done <- err
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return within 30s of cancel")
		}
	})
	return r
}

// Ended waits for Run to return by itself and returns its error. It fails
// the test if Run is still running after within.
func (r *Running) Ended(t testing.TB, within time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(within):
		t.Fatalf("Run still running %v after the fault; a dead source must end it", within)
		return nil
	}
}

// StillRunning fails the test if Run has returned; when says at what point
// of the test.
func (r *Running) StillRunning(t testing.TB, when string) {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err
		t.Fatalf("Run returned %v %s; a transient fault must be retried", err, when)
	default:
	}
}

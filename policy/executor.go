package policy

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Run runs fn through the guard: Admit, the bulkhead (if any), then for
// each attempt the breaker permit, BeforeAttempt, the attempt (its ctx ends
// after AttemptTimeout or at the Deadline, whichever is first), the outcome
// recorded (a slow success is a failure to the breaker), and the retry
// decision with budget and backoff. It returns nil on the first success, or
// the error that ended the work:
//
//   - the last attempt's error (permanent, or the attempts are used up);
//   - an [*OpenError] when the breaker refused an attempt, or opened and
//     will still be open after the backoff (no token is spent then);
//   - an [*ExhaustedError] when the retry budget refused a retry;
//   - a [*BulkheadError] when Bulkhead.MaxConcurrent (or the adaptive
//     limit) units of work of this guard were in Run already;
//   - an [*AdmitError] when Admit refused, or BeforeAttempt's error;
//   - the last attempt's error joined with ctx's error when ctx ended during
//     an attempt or a backoff (a backoff is interrupted at once), or with
//     [context.DeadlineExceeded] when the next backoff would outlive the
//     deadline.
//
// An attempt ended by its AttemptTimeout is a failed attempt like any
// other, and is retried. A panic in fn is recorded as a failure and
// re-raised.
func (h *Guard) Run(ctx context.Context, fn func(context.Context) error) error {
	r := draw()
	g, sh := h.enter(r)
	var err error
	if g.r.plainRun {
		err = g.run(ctx, fn, r)
	} else {
		err = g.runAdmitted(ctx, fn, r)
	}
	g.exit(sh) // skipped if fn panics: the state is then never reused
	return err
}

// runAdmitted is Guard.Run with an Admit hook or a bulkhead.
func (g *guard) runAdmitted(ctx context.Context, fn func(context.Context) error, r uint32) error {
	if err := g.admit(ctx); err != nil {
		return err
	}
	if g.r.bulkhead {
		return g.runBulkhead(ctx, fn, r)
	}
	return g.run(ctx, fn, r)
}

// run is the attempt loop of Guard.Run on state g, after Admit; r is a
// random number for the first attempt (the same one Guard.Run counted the
// call in with, so that both write one counter shard's line). It has one
// defer, so that the compiler open-codes it: two defers and its many
// returns would make every call go through the runtime's defer records.
func (g *guard) run(ctx context.Context, fn func(context.Context) error, r uint32) error {
	if g.r.deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.r.deadline)
		defer cancel()
	}
	var prev time.Duration
	var last error
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			if last != nil {
				return errors.Join(last, err)
			}
			return err
		}
		var p Permit
		if attempt > 1 {
			r = draw()
		}
		err := g.acquire(&p, r)
		if err != nil {
			g.emit(Event{Kind: EventRejected, Attempt: attempt, Err: err})
			return err
		}
		if g.r.before != nil {
			if err := g.r.before(ctx, attempt); err != nil {
				p.Release()
				return err
			}
		}
		err = g.attempt(ctx, &p, attempt, fn)
		if err == nil {
			return nil
		}
		if cerr := ctx.Err(); cerr != nil {
			if errors.Is(err, cerr) {
				return err
			}
			return errors.Join(err, cerr)
		}
		dec := g.nextRetry(ctx, attempt, err, prev)
		if !dec.Retry {
			switch dec.Stop {
			case StopOpen:
				return g.openErr.Load()
			case StopBudget:
				return &ExhaustedError{Attempts: attempt, Err: err}
			case stopDeadline:
				return errors.Join(err, context.DeadlineExceeded)
			}
			return err // StopPermanent, StopAttempts
		}
		prev, last = dec.Delay, err
		if serr := sleep(ctx, dec.Delay); serr != nil {
			return errors.Join(err, serr)
		}
	}
}

// attempt runs fn once under permit p, on a ctx that ends after
// AttemptTimeout, and reports the outcome to p.
func (g *guard) attempt(ctx context.Context, p *Permit, attempt int, fn func(context.Context) error) (err error) {
	if !g.r.plainAttempt {
		return g.attemptFull(ctx, p, attempt, fn)
	}
	finished := false
	defer func() {
		if !finished {
			unfinished(p, nil, recover())
		}
	}()
	err = fn(ctx)
	finished = true
	p.Done(err)
	return err
}

// attemptFull is attempt with an AttemptTimeout or hedging.
func (g *guard) attemptFull(ctx context.Context, p *Permit, attempt int, fn func(context.Context) error) (err error) {
	var ac *attemptCtx
	if g.r.attemptTimeout > 0 {
		ac = g.attemptCtx(ctx, p)
		ctx = ac
	}
	finished := false
	defer func() {
		if !finished {
			unfinished(p, ac, recover())
		}
	}()
	if g.r.hedge {
		err = g.hedged(ctx, attempt, fn)
	} else {
		err = fn(ctx)
	}
	finished = true
	if ac != nil {
		if err != nil && ac.timedOut() {
			err = AttemptTimedOut(err)
		}
		ac.leave()
	}
	p.Done(err)
	return err
}

// unfinished records an attempt that did not finish, given what its
// deferred function recovered: fn panicked with r (recorded as a failure
// and re-raised), or called runtime.Goexit (r is nil: recorded, and let go
// on).
func unfinished(p *Permit, ac *attemptCtx, r any) {
	if ac != nil {
		ac.leave()
	}
	if r == nil {
		p.Done(errGoexit)
		return
	}
	p.Done(fmt.Errorf("policy: panic: %v", r))
	panic(r)
}

// hedged runs fn and, if it is still running after the latency estimate,
// a second copy; the first success wins and the other is cancelled. Both
// copies are one attempt: the caller reports one outcome.
func (g *guard) hedged(ctx context.Context, attempt int, fn func(context.Context) error) error {
	delay := max(time.Duration(g.lat.est.Load()), g.r.hedgeMin)
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan error, 2)
	run := func() {
		var err error
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("policy: panic: %v", r)
			}
			results <- err
		}()
		err = fn(hctx)
	}
	go run()
	timer := time.NewTimer(delay)
	defer timer.Stop()
	running := 1
	for {
		select {
		case err := <-results:
			running--
			if err == nil || running == 0 {
				return err
			}
		case <-timer.C:
			if running == 1 {
				g.emit(Event{Kind: EventHedgeStarted, Attempt: attempt, Delay: delay})
				running++
				go run()
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var errGoexit = errors.New("policy: attempt called runtime.Goexit")

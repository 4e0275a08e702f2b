package examplerun

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ringfence/ringfence/consumer"
)

// pollEvery is how often UntilSettled reads the consumer's Stats.
const pollEvery = 20 * time.Millisecond

// UntilSettled runs c on src until n messages were handled or
// dead-lettered, then stops c and returns Run's error. If ctx ends or Run
// returns first, it says how many of the n were settled.
func UntilSettled(ctx context.Context, c *consumer.Consumer, src consumer.Source, n int) error {
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, src) }()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		st := c.Stats()
		settled := st.Handled + st.DeadLettered
		if int(settled) >= n {
			stop()
			return <-done
		}
		select {
		case <-ctx.Done():
			<-done // Run ends with ctx
			return fmt.Errorf("%d of %d messages settled: %w", settled, n, ctx.Err())
		case err := <-done:
			if ctx.Err() != nil {
				err = ctx.Err()
			} else if err == nil {
				err = errors.New("consumer stopped")
			}
			return fmt.Errorf("%d of %d messages settled: %w", settled, n, err)
		case <-t.C:
		}
	}
}

package nats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrConsumerGone is wrapped by the error Run returns when the durable
// consumer can never deliver again: it or its stream was deleted, or
// JetStream was disabled for the account. The error also wraps nats.go's
// own (jetstream.ErrConsumerDeleted, ErrConsumerNotFound, ErrStreamNotFound,
// ErrJetStreamNotEnabled or ErrJetStreamNotEnabledForAccount).
var ErrConsumerGone = errors.New("nats: consumer is gone")

// verdict is what an error from consuming, or from a liveness probe, means
// for Run.
type verdict int

const (
	// retry: transient; nats.go retries (a pull after a missed heartbeat,
	// a reconnect), Run logs it at Warn and goes on.
	retry verdict = iota
	// check: transient unless the consumer is gone, which nats.go cannot
	// tell (a deleted consumer answers a new pull with "no responders");
	// Run probes the consumer's info at once.
	check
	// gone: the consumer, its stream or JetStream is gone for good.
	gone
	// fatal: the client can never consume again (closed connection, a
	// pull request the server refuses).
	fatal
)

// classify maps an error from jetstream's consume error handler, or from
// Consumer.Info, to a verdict.
func classify(err error) verdict {
	switch {
	case errors.Is(err, jetstream.ErrConsumerDeleted),
		errors.Is(err, jetstream.ErrConsumerNotFound),
		errors.Is(err, jetstream.ErrStreamNotFound),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return gone
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, jetstream.ErrBadRequest):
		return fatal
	case errors.Is(err, jetstream.ErrNoHeartbeat), errors.Is(err, nats.ErrNoResponders):
		return check
	default:
		// Server shutdown (the server answers waiting pulls before it
		// stops), leadership change, timeouts, a reconnecting connection.
		// No responders and timeouts stay transient: JetStream behind a
		// leaf node or in a cluster being restarted looks like this.
		return retry
	}
}

// liveness collects what the consume error handler learns, for Run. Safe
// for concurrent use.
type liveness struct {
	probe chan struct{} // capacity 1: a probe is wanted now
	dead  chan struct{} // closed by die
	once  sync.Once
	err   error // written before dead is closed
}

func newLiveness() *liveness {
	return &liveness{probe: make(chan struct{}, 1), dead: make(chan struct{})}
}

func (l *liveness) die(err error) {
	l.once.Do(func() {
		l.err = err
		close(l.dead)
	})
}

// cause returns the error die recorded, or nil.
func (l *liveness) cause() error {
	select {
	case <-l.dead:
		return l.err
	default:
		return nil
	}
}

// terminalErr wraps a terminal error for Run, naming the consumer.
func (s *Source) terminalErr(v verdict, err error) error {
	if v == gone {
		return fmt.Errorf("%w: %s/%s: %w", ErrConsumerGone, s.stream, s.durable, err)
	}
	return fmt.Errorf("nats: consume %s/%s: %w", s.stream, s.durable, err)
}

// onConsumeErr is jetstream's ConsumeErrHandler. It runs on nats.go's
// goroutines, so it only classifies and signals; Run does the rest.
func (s *Source) onConsumeErr(l *liveness, err error) {
	switch v := classify(err); v {
	case gone, fatal:
		l.die(s.terminalErr(v, err))
	case check:
		s.log.Warn("ringfence nats: consume; checking the consumer", "err", err)
		select {
		case l.probe <- struct{}{}:
		default:
		}
	default:
		s.log.Warn("ringfence nats: consume; retrying", "err", err)
	}
}

// watch waits until ctx ends (nil) or the consumer can never deliver again
// (the error). It probes the consumer's info every liveness interval and
// whenever a consume error calls for it, so a consumer deleted while no
// pull request was waiting (the Source paused, the client reconnecting) is
// found too.
func (s *Source) watch(ctx context.Context, cc jetstream.ConsumeContext, l *liveness) error {
	nc := s.js.Conn()
	status := nc.StatusChanged(nats.RECONNECTING, nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(status)
	closed := cc.Closed()
	t := time.NewTicker(s.opt.liveness)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.dead:
			return l.err
		case <-closed:
			// nats.go stops consuming by itself only for good: a closed
			// connection or a terminal status.
			if err := l.cause(); err != nil {
				return err
			}
			if nc.IsClosed() {
				return s.terminalErr(fatal, nats.ErrConnectionClosed)
			}
			return fmt.Errorf("nats: consume %s/%s stopped by the client", s.stream, s.durable)
		case st := <-status:
			switch st {
			case nats.RECONNECTING:
				s.log.Warn("ringfence nats: connection lost; reconnecting")
			case nats.CONNECTED:
				// The consumer may have been deleted while we were away.
				s.log.Info("ringfence nats: reconnected")
				if err := s.probe(ctx); err != nil {
					return err
				}
			case nats.CLOSED:
				return s.terminalErr(fatal, nats.ErrConnectionClosed)
			}
		case <-l.probe:
			if err := s.probe(ctx); err != nil {
				return err
			}
		case <-t.C:
			if nc.Status() != nats.CONNECTED {
				continue // the outage is logged; a probe now would only time out
			}
			if err := s.probe(ctx); err != nil {
				return err
			}
		}
	}
}

// probe asks the server for the consumer's info once. It returns a
// terminal error, or nil when the consumer exists or the answer was
// transient (logged at Warn).
func (s *Source) probe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, max(s.opt.liveness, time.Second))
	defer cancel()
	_, err := s.cons.Info(pctx)
	if err == nil || ctx.Err() != nil {
		return nil
	}
	switch v := classify(err); v {
	case gone, fatal:
		return s.terminalErr(v, err)
	default:
		s.log.Warn("ringfence nats: consumer info failed; retrying", "err", err)
		return nil
	}
}

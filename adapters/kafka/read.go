package kafka

// Reading the spill log's and the DLQ inspector's topics: records fetched
// through internal/wire (the decoder the source uses too) and copied out
// of the response.

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire"
	"github.com/ringfence/ringfence/dlq"
)

// fetchStalls is how many fetches in a row may return nothing new before a
// read gives up on the rest of a partition (a gap, or only control records
// left).
const fetchStalls = 3

// fetched is one record read from a partition, its own copy.
type fetched struct {
	offset  int64
	time    time.Time
	key     []byte
	value   []byte
	headers []dlq.Header
}

// fetchedOf copies a record out of a fetch response, keeping null (nil)
// apart from empty.
func fetchedOf(r *wire.Record, hs []wire.Header) *fetched {
	m := &fetched{offset: r.Offset, time: time.UnixMilli(r.Time), key: bytes.Clone(r.Key), value: bytes.Clone(r.Value)}
	if len(hs) > 0 {
		m.headers = make([]dlq.Header, len(hs))
		for i, h := range hs {
			m.headers[i] = dlq.Header{Key: string(h.Key), Value: bytes.Clone(h.Value)}
		}
	}
	return m
}

// readRange calls fn, in order, for each record of topic/p in [from, to)
// until fn returns an error, which it returns.
func readRange(ctx context.Context, cl *wire.Client, topic string, p int, from, to int64, o wire.FetchOptions, fn func(*fetched) error) error {
	for stalls := 0; from < to && stalls < fetchStalls; {
		before := from
		var fnErr, err error
		from, _, err = cl.Fetch(ctx, topic, int32(p), from, o, func(r *wire.Record, hs []wire.Header) error {
			if r.Offset >= to {
				return wire.ErrStop
			}
			fnErr = fn(fetchedOf(r, hs))
			return fnErr
		})
		switch {
		case fnErr != nil:
			return fnErr
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			return fmt.Errorf("kafka: read %s/%d at %d: %w", topic, p, before, err)
		case from == before:
			stalls++ // a gap, or nothing fetched: give up on the rest
		default:
			stalls = 0
		}
	}
	return nil
}

package wire

import (
	"context"
	"errors"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

const (
	// idlePerBroker bounds the idle connections a Client keeps per broker.
	idlePerBroker = 4
	// idleFor is how long an idle connection is kept: well below the
	// broker's connections.max.idle.ms (10 minutes by default), after
	// which the broker closes it.
	idleFor = 2 * time.Minute
)

// A Client fetches partitions for reads that come and go (the spill log's
// and the DLQ inspector's): it keeps idle connections per broker and the
// leader of each partition it read, and finds a leader again when one
// moved. The source's fetchers keep a connection of their own instead. A
// Client is safe for concurrent use; no lock is held across a network
// call.
type Client struct {
	dialer  *kafkago.Dialer
	brokers []string

	mu      sync.Mutex
	idle    map[string][]idleConn  // by broker address, most recent last
	leaders map[topicPart]leaderOf // what FindLeader said
	closed  bool
}

type idleConn struct {
	c     *Conn
	since time.Time
}

type topicPart struct {
	topic string
	part  int32
}

type leaderOf struct {
	addr  string
	epoch int32
}

// NewClient returns a Client reaching the cluster through brokers
// (host:port), connecting as d does.
func NewClient(d *kafkago.Dialer, brokers []string) *Client {
	return &Client{
		dialer:  d,
		brokers: append([]string(nil), brokers...),
		idle:    map[string][]idleConn{},
		leaders: map[topicPart]leaderOf{},
	}
}

// Close closes the idle connections; connections in use are closed when
// they are given back.
func (cl *Client) Close() {
	cl.mu.Lock()
	idle := cl.idle
	cl.idle, cl.closed = map[string][]idleConn{}, true
	cl.mu.Unlock()
	for _, cs := range idle {
		for _, ic := range cs {
			ic.c.Close()
		}
	}
}

// get returns an idle connection to addr, or a new one (always with
// fresh).
func (cl *Client) get(ctx context.Context, addr string, fresh bool) (*Conn, error) {
	if fresh {
		return Dial(ctx, cl.dialer, addr)
	}
	now := time.Now()
	var stale []*Conn
	var c *Conn
	cl.mu.Lock()
	cs := cl.idle[addr]
	for len(cs) > 0 && c == nil {
		ic := cs[len(cs)-1]
		cs = cs[:len(cs)-1]
		if now.Sub(ic.since) > idleFor || ic.c.Stale() {
			stale = append(stale, ic.c)
			continue
		}
		c = ic.c
	}
	cl.idle[addr] = cs
	cl.mu.Unlock()
	for _, s := range stale {
		s.Close()
	}
	if c != nil {
		return c, nil
	}
	return Dial(ctx, cl.dialer, addr)
}

// put gives c back: kept idle, or closed when it is Stale, the Client is
// closed, or enough idle connections to its broker are kept already.
func (cl *Client) put(c *Conn) {
	c.ReleaseBuf()
	if !c.Stale() {
		cl.mu.Lock()
		keep := !cl.closed && len(cl.idle[c.addr]) < idlePerBroker
		if keep {
			cl.idle[c.addr] = append(cl.idle[c.addr], idleConn{c: c, since: time.Now()})
		}
		cl.mu.Unlock()
		if keep {
			return
		}
	}
	c.Close()
}

// leader returns a connection to the leader of tp and the leader epoch;
// with fresh, over new connections only.
func (cl *Client) leader(ctx context.Context, tp topicPart, fresh bool) (c *Conn, epoch int32, err error) {
	cl.mu.Lock()
	l, known := cl.leaders[tp]
	cl.mu.Unlock()
	if !known {
		lctx, cancel := context.WithTimeout(ctx, Slack)
		defer cancel()
		get := func(addr string) (*Conn, error) { return cl.get(lctx, addr, fresh) }
		l.addr, l.epoch, c, err = FindLeader(lctx, cl.brokers, tp.topic, tp.part, get, cl.put)
		if err != nil {
			return nil, -1, err
		}
		cl.mu.Lock()
		cl.leaders[tp] = l
		cl.mu.Unlock()
	}
	if c == nil {
		if c, err = cl.get(ctx, l.addr, fresh); err != nil {
			cl.forget(tp)
			return nil, -1, err
		}
	}
	return c, l.epoch, nil
}

func (cl *Client) forget(tp topicPart) {
	cl.mu.Lock()
	delete(cl.leaders, tp)
	cl.mu.Unlock()
}

// ErrStop, returned by the fn of Client.Fetch, stops the walk over the
// records without an error.
var ErrStop = errors.New("wire: stop")

// Fetch fetches topic/part once from offset (see Fetch.Send) and calls fn,
// in order, for each data record at offset or later, with the record's
// headers; what they point to is valid only during the call. It returns
// the offset after the records it passed (control records and the end of
// a compacted batch included) and the partition's high watermark. When fn
// returns an error, Fetch stops and returns it (nil for ErrStop) with the
// offset of that record.
//
// A failure that may come from what the Client kept (a leader that moved,
// an idle connection the broker closed) is tried once more, with the
// leader looked up again on a new connection; an answer of the cluster
// (an unknown topic, an offset out of range) is not.
func (cl *Client) Fetch(ctx context.Context, topic string, part int32, offset int64, o FetchOptions, fn func(*Record, []Header) error) (next, hw int64, err error) {
	tp := topicPart{topic, part}
	f := NewFetch(topic, part, o)
	for retried := false; ; retried = true {
		again := !retried && ctx.Err() == nil
		c, epoch, err := cl.leader(ctx, tp, retried)
		if err != nil {
			var ke kafkago.Error
			if again && !errors.As(err, &ke) {
				continue
			}
			return offset, 0, err
		}
		v, err := FetchVersion(c)
		if err != nil {
			cl.put(c)
			return offset, 0, err
		}
		batches, hw, err := f.Send(ctx, c, v, offset, epoch)
		if err != nil {
			stale := c.Stale()
			cl.put(c)
			if stale {
				cl.forget(tp)
				if again {
					continue
				}
			}
			return offset, 0, err
		}
		next, err = walk(batches, offset, fn)
		cl.put(c)
		return next, hw, err
	}
}

// walk calls fn for each data record of batches at from or later.
func walk(batches []byte, from int64, fn func(*Record, []Header) error) (int64, error) {
	var r BatchReader
	r.Reset(batches, from)
	var rec Record
	var hdrs []Header
	for {
		var ok bool
		var err error
		if hdrs, ok, err = r.Read(&rec, hdrs[:0]); !ok {
			return r.NextOffset(), err
		}
		if err := fn(&rec, hdrs); err != nil {
			if errors.Is(err, ErrStop) {
				err = nil
			}
			return rec.Offset, err
		}
		r.Release()
	}
}

package wire

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// maxResponse bounds a response's size prefix. The read buffer grows with
// what actually arrives, never to a size prefix alone.
const maxResponse = 1 << 30

// Slack is how much longer than the broker's own wait (none but a Fetch's
// MaxWait) a request may take before it is abandoned as hung: a broker that
// vanished without closing the connection.
const Slack = 10 * time.Second

// A Conn is one connection to one broker. Requests are encoded and
// responses decoded with franz-go's kmsg, one at a time. It connects as a
// kafka-go Dialer does: its DialFunc (or a net.Dialer from LocalAddr,
// FallbackDelay and KeepAlive), Resolver, Timeout and Deadline, TLS
// (ServerName from the host when unset), ClientID and SASL mechanism
// (SaslHandshake v1, then SaslAuthenticate). Every version used is below
// the protocol's flexible versions. A Conn is not safe for concurrent use.
type Conn struct {
	addr     string
	nc       net.Conn
	format   *kmsg.RequestFormatter
	corr     int32
	versions []int16 // by API key: the broker's highest version, -1 for none
	// expires is when to reconnect, ahead of the broker ending the SASL
	// session (KIP-368); zero for never.
	expires time.Time
	broken  bool // an I/O error or a cancelled exchange: close it
	wbuf    []byte
	rbuf    []byte // the last response, from respBufs until ReleaseBuf
}

// Dial connects to addr as d would, asks the broker's API versions and
// authenticates.
func Dial(ctx context.Context, d *kafkago.Dialer, addr string) (*Conn, error) {
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	if !d.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Deadline)
		defer cancel()
	}
	nc, err := dialRaw(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	id := d.ClientID
	if id == "" {
		id = kafkago.DefaultClientID
	}
	c := &Conn{addr: addr, nc: nc, format: kmsg.NewRequestFormatter(kmsg.FormatterClientID(id))}
	if err := c.apiVersions(ctx); err != nil {
		c.Close()
		return nil, err
	}
	if d.SASLMechanism != nil {
		if err := c.authenticate(ctx, d.SASLMechanism); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// dialRaw opens the TCP (and TLS) connection.
func dialRaw(ctx context.Context, d *kafkago.Dialer, addr string) (net.Conn, error) {
	address, err := resolveAddr(ctx, addr, d.Resolver)
	if err != nil {
		return nil, err
	}
	dial := d.DialFunc
	if dial == nil {
		dial = (&net.Dialer{LocalAddr: d.LocalAddr, FallbackDelay: d.FallbackDelay, KeepAlive: d.KeepAlive}).DialContext
	}
	nc, err := dial(ctx, "tcp", address)
	if err != nil {
		return nil, fmt.Errorf("kafka: failed to open connection to %s: %w", address, err)
	}
	if d.TLS == nil {
		return nc, nil
	}
	cfg := d.TLS
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName, _, _ = net.SplitHostPort(address)
	}
	tc := tls.Client(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("kafka: TLS handshake with %s: %w", address, err)
	}
	return tc, nil
}

// resolveAddr applies a kafka-go Resolver to addr as kafka-go does: the
// first address it returns replaces the host, and its port is used only
// when addr has none.
func resolveAddr(ctx context.Context, addr string, r kafkago.Resolver) (string, error) {
	if r == nil {
		return addr, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = addr, ""
	}
	resolved, err := r.LookupHost(ctx, host)
	if err != nil {
		return "", fmt.Errorf("kafka: failed to resolve host %s: %w", host, err)
	}
	if len(resolved) > 0 {
		h, p, err := net.SplitHostPort(resolved[0])
		if err != nil {
			h, p = resolved[0], ""
		}
		host = h
		if port == "" {
			port = p
		}
	}
	if port == "" {
		port = "9092"
	}
	return net.JoinHostPort(host, port), nil
}

// Addr is the broker's address, as dialled.
func (c *Conn) Addr() string { return c.addr }

// Close closes the connection.
func (c *Conn) Close() { _ = c.nc.Close() }

// Stale reports whether c should be closed before its next request: an
// exchange failed or was cancelled, or the broker's SASL session ends soon.
func (c *Conn) Stale() bool {
	return c.broken || !c.expires.IsZero() && time.Now().After(c.expires)
}

// Version returns the broker's highest version of the API key, -1 if none.
func (c *Conn) Version(key kmsg.Key) int16 {
	if int(key) < len(c.versions) {
		return c.versions[key]
	}
	return -1
}

// RoundTrip sends req and decodes the answer into resp, within timeout (or
// ctx's deadline, if sooner). Cancelling ctx aborts a blocked read or
// write. After an error c is Stale; the caller closes it. What resp decoded
// may point into c's response buffer until ReleaseBuf.
func (c *Conn) RoundTrip(ctx context.Context, req kmsg.Request, resp kmsg.Response, timeout time.Duration) error {
	name := kmsg.NameForKey(req.Key())
	if err := ctx.Err(); err != nil {
		c.broken = true
		return fmt.Errorf("kafka: %s to %s: %w", name, c.addr, err)
	}
	dl := time.Now().Add(timeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	if err := c.nc.SetDeadline(dl); err != nil {
		c.broken = true
		return fmt.Errorf("kafka: %s to %s: %w", name, c.addr, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })
	err := c.exchange(req, resp)
	if !stop() {
		// ctx ended: its deadline may land on the next exchange.
		c.broken = true
		if err != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
	}
	if err != nil {
		c.broken = true
		return fmt.Errorf("kafka: %s to %s: %w", name, c.addr, err)
	}
	return nil
}

func (c *Conn) exchange(req kmsg.Request, resp kmsg.Response) error {
	c.corr++
	c.wbuf = c.format.AppendRequest(c.wbuf[:0], req, c.corr)
	if _, err := c.nc.Write(c.wbuf); err != nil {
		return err
	}
	var size [4]byte
	if _, err := io.ReadFull(c.nc, size[:]); err != nil {
		return err
	}
	n := int32(binary.BigEndian.Uint32(size[:]))
	if n < 4 || n > maxResponse {
		return fmt.Errorf("response size %d out of range", n)
	}
	if c.rbuf == nil {
		c.rbuf = getRespBuf()
	}
	var err error
	if c.rbuf, err = readFull(c.nc, c.rbuf[:0], int(n)); err != nil {
		return err
	}
	if corr := int32(binary.BigEndian.Uint32(c.rbuf)); corr != c.corr {
		return fmt.Errorf("response to request %d answers request %d", c.corr, corr)
	}
	body := c.rbuf[4:]
	// A flexible response's header has tags, but never ApiVersions'.
	if resp.IsFlexible() && req.Key() != int16(kmsg.ApiVersions) {
		if body, err = skipTags(body); err != nil {
			return err
		}
	}
	resp.SetVersion(req.GetVersion())
	if err := resp.ReadFrom(body); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	return nil
}

// respBufs holds response buffers between fetches. A buffer is taken once
// a response's size has arrived, not while a fetch waits for data, and
// given back once the response's records were copied out, so the memory
// held for responses follows the fetches being read at the moment, not the
// number of partitions assigned (each would otherwise keep a buffer as large
// as its largest response, up to MaxBytes, for as long as it is assigned).
var respBufs sync.Pool

func getRespBuf() []byte {
	if b, ok := respBufs.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return nil
}

// ReleaseBuf gives c's response buffer back; what the last response decoded
// into must not be read afterwards.
func (c *Conn) ReleaseBuf() {
	if cap(c.rbuf) == 0 {
		return
	}
	b := c.rbuf[:0]
	c.rbuf = nil
	respBufs.Put(&b)
}

// Buffered reports whether c holds a response buffer: from a RoundTrip
// until ReleaseBuf.
func (c *Conn) Buffered() bool { return c.rbuf != nil }

// readFull reads n bytes into buf, growing it with what arrives (at most
// doubling it at a time) rather than to n at once.
func readFull(r io.Reader, buf []byte, n int) ([]byte, error) {
	if cap(buf) >= n {
		buf = buf[:n]
		_, err := io.ReadFull(r, buf)
		return buf, err
	}
	for len(buf) < n {
		chunk := min(n-len(buf), max(len(buf), 64<<10))
		buf = slices.Grow(buf, chunk)
		m, err := io.ReadFull(r, buf[len(buf):len(buf)+chunk])
		buf = buf[:len(buf)+m]
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// skipTags skips a flexible response header's tagged fields.
func skipTags(b []byte) ([]byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, errors.New("bad response header tags")
	}
	b = b[k:]
	for range n {
		if _, k = binary.Uvarint(b); k <= 0 {
			return nil, errors.New("bad response header tag")
		}
		b = b[k:]
		size, k := binary.Uvarint(b)
		if k <= 0 || size > uint64(len(b)-k) {
			return nil, errors.New("bad response header tag size")
		}
		b = b[k+int(size):]
	}
	return b, nil
}

// apiVersions learns the broker's API versions (ApiVersions v0, which
// every broker answers).
func (c *Conn) apiVersions(ctx context.Context) error {
	req := kmsg.NewPtrApiVersionsRequest()
	resp := req.ResponseKind().(*kmsg.ApiVersionsResponse)
	if err := c.RoundTrip(ctx, req, resp, Slack); err != nil {
		return err
	}
	if resp.ErrorCode != 0 {
		return fmt.Errorf("kafka: ApiVersions to %s: %w", c.addr, kafkago.Error(resp.ErrorCode))
	}
	for _, k := range resp.ApiKeys {
		if k.ApiKey < 0 || k.ApiKey > 1024 {
			continue
		}
		for int(k.ApiKey) >= len(c.versions) {
			c.versions = append(c.versions, -1)
		}
		c.versions[k.ApiKey] = k.MaxVersion
	}
	return nil
}

// authenticate runs mech over SaslHandshake v1 and SaslAuthenticate. A
// refusal wraps the broker's error (SASLAuthenticationFailed,
// UnsupportedSASLMechanism, IllegalSASLState: terminal for the source); a
// broker that closes the connection instead counts as
// SASLAuthenticationFailed, as in kafka-go.
func (c *Conn) authenticate(ctx context.Context, mech sasl.Mechanism) error {
	if c.Version(kmsg.SASLHandshake) < 1 || c.Version(kmsg.SASLAuthenticate) < 0 {
		return fmt.Errorf("kafka: SASL with %s: the broker supports no SaslHandshake v1 and SaslAuthenticate: %w", c.addr, kafkago.UnsupportedSASLMechanism)
	}
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.Version = 1
	hs.Mechanism = mech.Name()
	hsResp := hs.ResponseKind().(*kmsg.SASLHandshakeResponse)
	if err := c.RoundTrip(ctx, hs, hsResp, Slack); err != nil {
		return err
	}
	if hsResp.ErrorCode != 0 {
		return fmt.Errorf("kafka: SASL handshake with %s for %s (the broker offers %v): %w", c.addr, mech.Name(), hsResp.SupportedMechanisms, kafkago.Error(hsResp.ErrorCode))
	}
	host, port, _ := net.SplitHostPort(c.addr)
	portN, _ := strconv.Atoi(port)
	sess, state, err := mech.Start(sasl.WithMetadata(ctx, &sasl.Metadata{Host: host, Port: portN}))
	if err != nil {
		return fmt.Errorf("kafka: SASL %s with %s could not start: %w", mech.Name(), c.addr, err)
	}
	version := min(c.Version(kmsg.SASLAuthenticate), 1)
	for done := false; !done; {
		req := kmsg.NewPtrSASLAuthenticateRequest()
		req.Version = version
		req.SASLAuthBytes = state
		resp := req.ResponseKind().(*kmsg.SASLAuthenticateResponse)
		started := time.Now()
		if err := c.RoundTrip(ctx, req, resp, Slack); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return fmt.Errorf("kafka: SASL %s with %s: the broker closed the connection: %w", mech.Name(), c.addr, kafkago.SASLAuthenticationFailed)
			}
			return err
		}
		if resp.ErrorCode != 0 {
			msg := ""
			if resp.ErrorMessage != nil {
				msg = ": " + *resp.ErrorMessage
			}
			return fmt.Errorf("kafka: SASL %s with %s%s: %w", mech.Name(), c.addr, msg, kafkago.Error(resp.ErrorCode))
		}
		if ms := resp.SessionLifetimeMillis; ms > 0 {
			c.expires = started.Add(time.Duration(ms) * time.Millisecond * 3 / 4)
		}
		if done, state, err = sess.Next(ctx, resp.SASLAuthBytes); err != nil {
			return fmt.Errorf("kafka: SASL %s with %s has failed: %w", mech.Name(), c.addr, err)
		}
	}
	return nil
}

// Leader asks the broker which broker leads topic/part: its address, and
// the leader epoch (-1 when the broker's Metadata is older than v7). The
// request never creates the topic.
func (c *Conn) Leader(ctx context.Context, topic string, part int32) (string, int32, error) {
	v := min(c.Version(kmsg.Metadata), 8)
	if v < 1 {
		return "", -1, fmt.Errorf("kafka: broker %s supports no Metadata v1", c.addr)
	}
	req := kmsg.NewPtrMetadataRequest()
	req.Version = v
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = []kmsg.MetadataRequestTopic{rt}
	req.AllowAutoTopicCreation = false
	resp := req.ResponseKind().(*kmsg.MetadataResponse)
	if err := c.RoundTrip(ctx, req, resp, Slack); err != nil {
		return "", -1, err
	}
	where := fmt.Sprintf("kafka: leader of %s/%d (metadata from %s)", topic, part, c.addr)
	var t *kmsg.MetadataResponseTopic
	for i := range resp.Topics {
		if resp.Topics[i].Topic != nil && *resp.Topics[i].Topic == topic {
			t = &resp.Topics[i]
		}
	}
	switch {
	case t == nil:
		return "", -1, fmt.Errorf("%s: no answer for the topic: %w", where, kafkago.UnknownTopicOrPartition)
	case t.ErrorCode != 0:
		return "", -1, fmt.Errorf("%s: %w", where, kafkago.Error(t.ErrorCode))
	}
	i := slices.IndexFunc(t.Partitions, func(p kmsg.MetadataResponseTopicPartition) bool { return p.Partition == part })
	if i < 0 {
		return "", -1, fmt.Errorf("%s: the topic has no such partition: %w", where, kafkago.UnknownTopicOrPartition)
	}
	p := t.Partitions[i]
	// ReplicaNotAvailable comes with a usable leader (a follower is down).
	if p.ErrorCode != 0 && p.ErrorCode != int16(kafkago.ReplicaNotAvailable) {
		return "", -1, fmt.Errorf("%s: %w", where, kafkago.Error(p.ErrorCode))
	}
	if p.Leader < 0 {
		return "", -1, fmt.Errorf("%s: %w", where, kafkago.LeaderNotAvailable)
	}
	for _, b := range resp.Brokers {
		if b.NodeID == p.Leader {
			epoch := int32(-1)
			if v >= 7 {
				epoch = p.LeaderEpoch
			}
			return net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))), epoch, nil
		}
	}
	return "", -1, fmt.Errorf("%s: leader %d is not among the brokers: %w", where, p.Leader, kafkago.LeaderNotAvailable)
}

// FindLeader finds the leader of topic/part, asking the brokers in turn
// (from a random one) until one answers; it takes each connection from get
// and hands it to put when done with it. When the broker that answered is
// the leader itself, its connection is returned (no second dial);
// otherwise conn is nil. An error is the cluster's answer (a kafka-go
// Error), ctx's, or every broker's failure joined.
func FindLeader(ctx context.Context, brokers []string, topic string, part int32, get func(addr string) (*Conn, error), put func(*Conn)) (addr string, epoch int32, conn *Conn, err error) {
	var errs []error
	start := rand.IntN(len(brokers))
	for i := range brokers {
		var c *Conn
		c, err = get(brokers[(start+i)%len(brokers)])
		if err == nil {
			addr, epoch, err = c.Leader(ctx, topic, part)
			if err == nil && addr == c.addr {
				return addr, epoch, c, nil
			}
			put(c)
			if err == nil {
				return addr, epoch, nil, nil
			}
		}
		var ke kafkago.Error
		if errors.As(err, &ke) || ctx.Err() != nil {
			return "", -1, nil, err // the cluster's answer, or out of time
		}
		errs = append(errs, err)
	}
	return "", -1, nil, fmt.Errorf("kafka: find the leader of %s/%d: %w", topic, part, errors.Join(errs...))
}

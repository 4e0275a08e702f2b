package console_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/scope"
)

// engineRun is an engine over the in-memory broker whose handler fails
// for the tenants marked down.
type engineRun struct {
	c       *consumer.Consumer
	b       *consumertest.Broker
	parts   int
	handled atomic.Int64
	down    sync.Map // tenant -> true while its dependency fails
	errc    chan error
	cancel  context.CancelFunc
}

func startEngine(t testing.TB, con *console.Console, partitions int) *engineRun {
	t.Helper()
	e := &engineRun{b: consumertest.NewBroker("orders", partitions), parts: partitions, errc: make(chan error, 1)}
	p := consumertest.FastPolicy()
	p.Breaker.OpenTimeout = 50 * time.Millisecond
	cfg := consumer.Config{
		Scope:  scope.New(p, scope.Options[string]{}),
		Tenant: consumer.FromKey(),
		DLQ:    consumertest.NewSink(),
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if _, down := e.down.Load(string(m.Key)); down {
				return errors.New("payment service: connection refused")
			}
			e.handled.Add(1)
			return nil
		}),
		Concurrency: 8,
		Group:       "billing",
	}
	if con != nil {
		cfg.OnEvent = con.OnEvent
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	if con != nil {
		con.SetEngine(c, "orders (in-memory broker)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() { e.errc <- c.Run(ctx, e.b.Source("billing")) }()
	t.Cleanup(func() {
		cancel()
		if err := <-e.errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("engine: %v", err)
		}
	})
	return e
}

// produce appends n messages round-robin over tenants.
func (e *engineRun) produce(tenants []string, n int) {
	for i := range n {
		k := tenants[i%len(tenants)]
		e.b.Append(i%e.parts, []byte(k), []byte(fmt.Sprintf("%s-%d", k, i)))
	}
}

// sseReader reads a live stream as fast as it can and counts its "stats"
// events, until the stream or ctx ends.
func sseReader(ctx context.Context, url string, stats *atomic.Int64, logs *atomic.Int64) error {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		return fmt.Errorf("live: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		switch sc.Text() {
		case "event: stats":
			stats.Add(1)
		case "event: log":
			if logs != nil {
				logs.Add(1)
			}
		}
	}
	return nil
}

// While viewers stream as fast as they can (a snapshot per loop, so
// consumer.Stats without pause) and one viewer has stopped reading, the
// engine keeps handling: every message is handled while the streams go on.
func TestLiveStreamsDoNotBlockEngine(t *testing.T) {
	con, err := console.New(console.Options{Refresh: time.Nanosecond, MaxStreams: 8})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { con.Close() })
	e := startEngine(t, con, 4)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stats, logs atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sseReader(ctx, srv.URL+"/live?after=0", &stats, &logs); err != nil && ctx.Err() == nil {
				t.Errorf("reader: %v", err)
			}
		}()
	}
	defer wg.Wait()
	defer cancel()

	// A viewer that asks for the stream and never reads it.
	stalled, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	if tc, ok := stalled.(*net.TCPConn); ok {
		tc.SetReadBuffer(4 << 10)
	}
	fmt.Fprintf(stalled, "GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")

	waitFor(t, 30*time.Second, "live streams running", func() bool { return stats.Load() >= 100 })
	before := stats.Load()

	tenants := []string{"acme", "globex", "initech", "umbrella", "hooli"}
	const n = 3000
	e.down.Store("hooli", true) // its breaker opens and it parks: events flow too
	e.produce(tenants, n)
	want := int64(n - n/len(tenants))
	waitFor(t, 90*time.Second, "healthy tenants handled", func() bool { return e.handled.Load() >= want })
	e.down.Delete("hooli")
	waitFor(t, 90*time.Second, "all handled", func() bool { return e.handled.Load() >= n })
	during := stats.Load() - before
	if during < 10 {
		t.Fatalf("only %d snapshots streamed while the engine handled %d messages: the streams stalled", during, n)
	}
	if logs.Load() == 0 {
		t.Fatal("no engine event reached the live streams")
	}
	// The page still answers.
	hc := client(t)
	if r := do(t, hc, "GET", srv.URL+"/", nil, nil); r.status != 200 || !strings.Contains(r.body, "hooli") {
		t.Fatalf("tenant view: %d", r.status)
	}
	t.Logf("%d messages handled while 4 viewers received %d snapshots (%d during handling) and %d events; one viewer stalled", n, stats.Load(), during, logs.Load())
}

// MaxStreams bounds the live streams; Close ends them.
func TestLiveStreamsBounded(t *testing.T) {
	eng := &countingEngine{}
	c, srv := serve(t, console.Options{Engine: eng, MaxStreams: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stats atomic.Int64
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- sseReader(ctx, srv.URL+"/live", &stats, nil) }()
	}
	waitFor(t, 10*time.Second, "two streams", func() bool { return stats.Load() >= 2 })
	hc := client(t)
	if r := do(t, hc, "GET", srv.URL+"/live", nil, nil); r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("third stream: %d", r.status)
	}
	c.Close()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("Close did not end the streams")
		}
	}
}

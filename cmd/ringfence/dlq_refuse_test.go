package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	rfkafka "github.com/ringfence/ringfence/adapters/kafka"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/kafkatest"
	"github.com/ringfence/ringfence/internal/natstest"
)

// These tests drive only the command line: its flags, exit codes and output.

// purge against a stream of live data exits 1 and deletes nothing; so do
// the other commands.
func TestDLQRefusesLiveStream(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	live, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LIVE", Subjects: []string{"live.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, "live.acme", []byte(fmt.Sprintf("order %d", i))); err != nil {
			t.Fatal(err)
		}
	}
	base := []string{"--nats", srv.URL(), "--stream", "LIVE"}
	for _, args := range [][]string{
		{"dlq", "purge", "--tenant", "acme", "--yes"},
		{"dlq", "purge", "--tenant", "acme", "--yes", "--subject-prefix", "live"},
		{"dlq", "replay", "--tenant", "acme"},
		{"dlq", "peek", "--tenant", "acme"},
		{"dlq", "ls"},
	} {
		code, out, errs := cli(t, append(args, base...)...)
		if code != 1 || !strings.Contains(errs, "not a ringfence") || strings.Contains(out, "purged") {
			t.Errorf("%v on a live stream: exit %d, stdout %q, stderr %q; want exit 1 saying it is not a ringfence DLQ", args, code, out, errs)
		}
	}
	if info, err := live.Info(ctx); err != nil || info.State.Msgs != 3 {
		t.Fatalf("live stream holds %d of 3 messages (%v)", info.State.Msgs, err)
	}
}

// purge against a topic named like a DLQ that holds live data exits 1 and
// moves no cursor; a misspelt --topic says that no DLQ exists and exits 1.
func TestDLQRefusesLiveTopic(t *testing.T) {
	t.Parallel()
	c := kafkatest.MustStart(t, kfake.SeedTopics(1, "live", "live.dlq.acme"))
	addr := c.Addrs()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := &kafkago.Writer{Addr: kafkago.TCP(addr), Topic: "live.dlq.acme", RequiredAcks: kafkago.RequireAll, BatchTimeout: time.Millisecond}
	for i := range 3 {
		if err := w.WriteMessages(ctx, kafkago.Message{Value: []byte(fmt.Sprintf("order %d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	base := []string{"--kafka", addr, "--topic", "live"}
	for _, args := range [][]string{
		{"dlq", "purge", "--tenant", "acme", "--yes"},
		{"dlq", "replay", "--tenant", "acme"},
		{"dlq", "ls"},
	} {
		code, out, errs := cli(t, append(args, base...)...)
		if code != 1 || !strings.Contains(errs, "not a ringfence") {
			t.Errorf("%v on a live topic: exit %d, stdout %q, stderr %q; want exit 1 saying it is not a ringfence DLQ", args, code, out, errs)
		}
	}
	cl := &kafkago.Client{Addr: kafkago.TCP(addr)}
	resp, err := cl.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: "ringfence-dlq", Topics: map[string][]int{"live.dlq.acme": {0}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range resp.Topics["live.dlq.acme"] {
		if p.CommittedOffset > 0 {
			t.Fatalf("a refused command moved the DLQ cursor to %d", p.CommittedOffset)
		}
	}

	code, out, errs := cli(t, "dlq", "ls", "--kafka", addr, "--topic", "lvie")
	if code != 1 || !strings.Contains(errs, "no DLQ") || strings.Contains(out, "no dead letters") {
		t.Fatalf("ls for a misspelt topic: exit %d, stdout %q, stderr %q; want exit 1 saying no DLQ exists", code, out, errs)
	}
}

// Bad flag values are usage errors: exit 2 before any network.
func TestDLQBadFlagValuesAreUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"dlq", "ls", "--nats", "nats://[bad", "--stream", "DLQ"},
		{"dlq", "ls", "--kafka", "localhost", "--topic", "orders"},
		{"dlq", "ls", "--kafka", "localhost:http", "--topic", "orders"},
		{"dlq", "ls", "--kafka", ":9092", "--topic", "orders"},
		{"dlq", "ls", "--kafka", "localhost:9092", "--topic", "bad topic!"},
		{"dlq", "ls", "--nats", "nats://localhost:4222", "--stream", "bad.stream"},
		{"dlq", "ls", "--nats", "nats://localhost:4222", "--stream", "DLQ", "--subject-prefix", "a.*"},
	} {
		code, _, errs := cli(t, args...)
		if code != 2 || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 with one line", args, code, errs)
		}
	}
}

// silentListener accepts connections and never answers.
func silentListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// A port that accepts but never answers fails within the handshake bound,
// not the whole --timeout.
func TestDLQSilentBrokerFailsFast(t *testing.T) {
	t.Parallel()
	addr := silentListener(t)
	for _, args := range [][]string{
		{"dlq", "ls", "--kafka", addr, "--topic", "orders", "--timeout", "60s"},
		{"dlq", "ls", "--nats", "nats://" + addr, "--stream", "DLQ", "--timeout", "60s"},
	} {
		start := time.Now()
		code, out, errs := cli(t, args...)
		el := time.Since(start)
		t.Logf("%v: %v, %s", args[2], el, strings.TrimSpace(errs))
		// The handshake bound, not a request's own timeout, ends it.
		if code != 1 || out != "" || strings.Count(strings.TrimSpace(errs), "\n") != 0 || !strings.Contains(errs, "no answer within 3s") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1 saying there was no answer within 3s", args, code, out, errs)
		}
		// Not a speed assertion: a hang would take the 60s --timeout.
		if el > 30*time.Second {
			t.Errorf("%v took %v: it waited for --timeout, not for the handshake bound", args, el)
		}
	}
}

// --json is JSON Lines for every command, and lossless: two invalid UTF-8
// keys stay apart and come back byte for byte, and repeated headers are
// all kept.
func TestDLQJSONIsLossless(t *testing.T) {
	t.Parallel()
	c := kafkatest.MustStart(t, kfake.SeedTopics(1, "orders"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sink, err := rfkafka.NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	keys := []string{"\xff", "\xfe"}
	for i, k := range keys {
		r := &dlq.Record{
			Tenant: k, Value: []byte("v"), Source: "orders", Offset: int64(i), Reason: dlq.ReasonPermanent,
			Headers: []dlq.Header{{Key: "h", Value: []byte("1")}, {Key: "h", Value: []byte("2")}},
		}
		if err := sink.Write(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	base := []string{"--kafka", c.Addrs()[0], "--topic", "orders"}
	objects := func(out string) []map[string]any {
		t.Helper()
		var objs []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var o map[string]any
			if err := json.Unmarshal([]byte(line), &o); err != nil {
				t.Fatalf("line %q is not a JSON object: %v", line, err)
			}
			objs = append(objs, o)
		}
		return objs
	}
	code, out, errs := cli(t, append([]string{"dlq", "ls", "--json"}, base...)...)
	if code != 0 {
		t.Fatalf("ls --json: exit %d %s", code, errs)
	}
	seen := map[string]bool{}
	for _, o := range objects(out) {
		tn, _ := o["tenant"].(map[string]any)
		b64, _ := tn["key_base64"].(string)
		raw, err := base64.StdEncoding.DecodeString(b64)
		if o["type"] != "tenant" || err != nil {
			t.Fatalf("ls --json line %v: want type tenant and the key in base64", o)
		}
		seen[string(raw)] = true
	}
	if len(seen) != 2 || !seen["\xff"] || !seen["\xfe"] {
		t.Fatalf("ls --json keys %v, want both invalid UTF-8 keys apart", seen)
	}
	code, out, errs = cli(t, append([]string{"dlq", "peek", "--json", "--tenant", "\xff"}, base...)...)
	if code != 0 {
		t.Fatalf("peek --json: exit %d %s", code, errs)
	}
	objs := objects(out)
	hs, _ := objs[0]["headers"].([]any)
	if len(objs) != 1 || len(hs) != 2 {
		t.Fatalf("peek --json: %s; want one record with both h headers", out)
	}
}

// ls names the no-tenant bucket, with its token, and sorts rows by key.
func TestDLQLsNamesTheNoTenantBucketAndSortsByKey(t *testing.T) {
	t.Parallel()
	c := kafkatest.MustStart(t, kfake.SeedTopics(1, "orders"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sink, err := rfkafka.NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	for i, k := range []string{"b", "a.b", "", "A"} {
		r := &dlq.Record{Tenant: k, Value: []byte("v"), Source: "orders", Offset: int64(i), Reason: dlq.ReasonPermanent}
		if k == "" {
			r.Reason = dlq.ReasonNoTenant
		}
		if err := sink.Write(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errs := cli(t, "dlq", "ls", "--kafka", c.Addrs()[0], "--topic", "orders")
	if code != 0 {
		t.Fatalf("ls: exit %d %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{"(no tenant) ", "A ", "a.b ", "b "}
	ok := len(lines) == 5 && strings.Contains(lines[1], "_none")
	for i := 0; ok && i < len(want); i++ {
		ok = strings.HasPrefix(lines[i+1], want[i])
	}
	if !ok {
		t.Fatalf("ls:\n%s\nwant the rows (no tenant) [token _none], A, a.b, b", out)
	}
}

package main

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	rfkafka "github.com/ringfence/ringfence/adapters/kafka"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/kafkatest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

const hostile = "evil.*> /../x"

// deadLetters writes dead letters for three tenants (one hostile) into
// the Kafka DLQ of source topic "orders", as the engine would.
func seedKafka(t *testing.T) string {
	t.Helper()
	c := kafkatest.MustStart(t, kfake.SeedTopics(1, "orders"))
	addr := c.Addrs()[0]
	sink, err := rfkafka.NewDLQ(c.Addrs(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now().UTC()
	for tenant, n := range map[string]int{"acme": 3, "globex": 2, hostile: 1} {
		for i := range n {
			r := &dlq.Record{
				Tenant: tenant, Key: []byte(tenant), Value: []byte(tenant + " order " + string(rune('a'+i))),
				Headers: []dlq.Header{{Key: "tenant", Value: []byte(tenant)}},
				Source:  "orders", Partition: 0, Offset: int64(10 + i), Group: "billing",
				Attempts: 3, FirstFailure: now.Add(-time.Minute), LastFailure: now,
				Error: "payment gateway said: card declined", ErrorType: "*errors.errorString", Reason: dlq.ReasonExhausted,
			}
			if err := sink.Write(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	return addr
}

func TestDLQKafka(t *testing.T) {
	addr := seedKafka(t)
	base := []string{"--kafka", addr, "--topic", "orders"}

	// ls: three rows, right counts, as a table and as JSON.
	code, out, errs := cli(t, append([]string{"dlq", "ls"}, base...)...)
	if code != 0 {
		t.Fatalf("ls exit %d: %s", code, errs)
	}
	t.Logf("ls:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "TENANT") {
		t.Fatalf("ls table has %d lines, want header + 3:\n%s", len(lines), out)
	}
	rows := lsJSON(t, base)
	got := map[string]int{}
	for k, r := range rows {
		got[k] = r.Count
		if r.Reason != "exhausted" || !strings.Contains(r.LastError, "card declined") || r.Oldest.IsZero() {
			t.Fatalf("row %+v", r)
		}
	}
	if got["acme"] != 3 || got["globex"] != 2 || got[hostile] != 1 || len(got) != 3 {
		t.Fatalf("counts %v", got)
	}

	// peek: decoded headers and a preview.
	code, out, errs = cli(t, append([]string{"dlq", "peek", "--tenant", "acme", "-n", "1"}, base...)...)
	if code != 0 {
		t.Fatalf("peek exit %d: %s", code, errs)
	}
	t.Logf("peek:\n%s", out)
	for _, want := range []string{"tenant:", "acme", "source:", "orders (partition 0, offset 10)", "reason:", "exhausted after 3 attempt(s)", "card declined", "group:", "billing", "value:", "acme order a"} {
		if !strings.Contains(out, want) {
			t.Fatalf("peek output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = cli(t, append([]string{"dlq", "peek", "--json", "--tenant", hostile}, base...)...)
	if code != 0 {
		t.Fatalf("peek --json hostile exit %d: %s", code, out)
	}
	if prs := jsonLines[recordLine](t, out, "record"); len(prs) != 1 || rawKey(t, prs[0].Tenant) != hostile || prs[0].Attempts != 3 {
		t.Fatalf("peek --json hostile: %s", out)
	}

	// replay --dry-run changes nothing; replay moves globex's two.
	code, out, _ = cli(t, append([]string{"dlq", "replay", "--tenant", "globex", "--dry-run"}, base...)...)
	if code != 0 || !strings.Contains(out, "2 dead letter(s)") {
		t.Fatalf("dry run exit %d: %s", code, out)
	}
	code, out, errs = cli(t, append([]string{"dlq", "replay", "--tenant", "globex"}, base...)...)
	if code != 0 || !strings.Contains(out, "replayed 2") {
		t.Fatalf("replay exit %d: %s %s", code, out, errs)
	}
	if n := counts(t, base)["globex"]; n != 0 {
		t.Fatalf("globex still has %d after replay", n)
	}

	// A consumer on the source topic now handles the replayed messages.
	handleReplayed(t, addr, "globex", 2)

	// purge refuses without --yes, then empties exactly the hostile tenant.
	if code, _, errs = cli(t, append([]string{"dlq", "purge", "--tenant", hostile}, base...)...); code != 2 || !strings.Contains(errs, "--yes") {
		t.Fatalf("purge without --yes: exit %d %s", code, errs)
	}
	code, out, errs = cli(t, append([]string{"dlq", "purge", "--tenant", hostile, "--yes"}, base...)...)
	if code != 0 || !strings.Contains(out, "purged 1") {
		t.Fatalf("purge exit %d: %s %s", code, out, errs)
	}
	if c := counts(t, base); c["acme"] != 3 || c[hostile] != 0 {
		t.Fatalf("after purge: %v", c)
	}
}

// handleReplayed runs the engine on the source topic and waits until n
// messages of tenant, with a raised redrive count, were handled.
func handleReplayed(t *testing.T, addr, tenant string, n int) {
	t.Helper()
	src, err := rfkafka.NewSource([]string{addr}, "orders", "cli-test")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := 0
	c, err := consumer.New(consumer.Config{
		Scope:  scope.New(policy.Default(), scope.Options[string]{}),
		Tenant: consumer.FromHeader("tenant"),
		DLQ:    dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil }),
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			tn, _ := m.Header("tenant")
			if string(tn) == tenant && dlq.RedriveCount(m.Headers) == 1 {
				mu.Lock()
				got++
				mu.Unlock()
			}
			return nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, src) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		g := got
		mu.Unlock()
		if g >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer handled %d of %d replayed messages", g, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestDLQUnreachableBrokerExits1Quickly(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	for _, args := range [][]string{
		{"dlq", "ls", "--kafka", addr, "--topic", "orders"},
		{"dlq", "ls", "--nats", "nats://" + addr, "--stream", "DLQ"},
	} {
		start := time.Now()
		code, out, errs := cli(t, args...)
		if code != 1 || out != "" || strings.Count(strings.TrimSpace(errs), "\n") != 0 || !strings.Contains(errs, "unreachable") && !strings.Contains(errs, "refused") {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
		// Not a timed assertion of speed: a hang would hit the 10s --timeout.
		if el := time.Since(start); el > 9*time.Second {
			t.Fatalf("%v took %v", args, el)
		}
	}
}

func TestDLQUsage(t *testing.T) {
	cases := []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"dlq"}, 2, "Usage"},
		{[]string{"dlq", "frob"}, 2, "unknown command"},
		{[]string{"dlq", "ls"}, 2, "--kafka"},
		{[]string{"dlq", "ls", "--kafka", "x:1"}, 2, "--topic"},
		{[]string{"dlq", "ls", "--nats", "nats://x", "--kafka", "x:1"}, 2, "not both"},
		{[]string{"dlq", "peek", "--kafka", "x:1", "--topic", "t"}, 2, "--tenant"},
		{[]string{"dlq", "ls", "--bogus"}, 2, "bogus"},
		{[]string{"nope"}, 2, "unknown command"},
	}
	for _, tc := range cases {
		code, _, errs := cli(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.err) {
			t.Errorf("%v: exit %d stderr %q, want %d containing %q", tc.args, code, errs, tc.code, tc.err)
		}
	}
	for _, args := range [][]string{{"--help"}, {"dlq", "--help"}, {"dlq", "ls", "--help"}, {"dlq", "peek", "-h"}, {"dlq", "replay", "--help"}, {"dlq", "purge", "--help"}} {
		if code, _, _ := cli(t, args...); code != 0 {
			t.Errorf("%v: exit %d, want 0", args, code)
		}
	}
}

func TestPrintable(t *testing.T) {
	cases := []struct{ in, want string }{
		{"plain", "plain"},
		{"tab\there", `tab\there`},
		{"bad\xffbyte", `bad\xffbyte`},
		{"ünï", "ünï"},
	}
	for _, tc := range cases {
		if got := printable(tc.in, 0); got != tc.want {
			t.Errorf("printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := printable("abcdef", 3); got != "abc…" {
		t.Errorf("cut: %q", got)
	}
}

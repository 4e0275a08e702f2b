package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/natstest"
)

// startConsole runs `ringfence console` with args on a free loopback port
// and returns the URL it printed (with ?token= unless a token was given).
func startConsole(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		code := runConsole(ctx, append(args, "--addr", "127.0.0.1:0"), pw, &errb)
		pw.Close()
		done <- code
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("console exit %d: %s", code, errb.String())
			}
		case <-time.After(30 * time.Second):
			t.Error("console did not stop within 30s of its context ending")
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	if err != nil {
		t.Fatalf("console printed no URL (%v): %s", err, errb.String())
	}
	rest, ok := strings.CutPrefix(line, "ringfence console: ")
	if !ok {
		t.Fatalf("first line %q", line)
	}
	return strings.Fields(rest)[0]
}

// httpDo sends a request and returns status and body.
func httpDo(t *testing.T, method, u string, form url.Values, hdr map[string]string) (int, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// consoleMatchesCLI checks that the console's JSON API answers the CLI's
// bytes for ls, peek and a replay dry run, refuses a POST without the
// token, and replays with it.
func consoleMatchesCLI(t *testing.T, base []string) {
	t.Helper()
	const token = "cmd-test-token-0123456789"
	u := startConsole(t, append([]string{"--token", token}, base...)...)
	if strings.Contains(u, token) {
		t.Fatalf("a given token is printed: %s", u)
	}
	get := func(path string) string {
		t.Helper()
		code, body := httpDo(t, "GET", u+strings.TrimPrefix(path, "/"), nil, map[string]string{"Accept": "application/json"})
		if code != 200 {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		return body
	}
	same := func(what, console string, args ...string) {
		t.Helper()
		code, out, errs := cli(t, append(args, base...)...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", what, code, errs)
		}
		if console == "" || console != out {
			t.Fatalf("%s: console and CLI differ\nconsole: %s\ncli:     %s", what, console, out)
		}
	}
	same("ls", get("/dlq"), "dlq", "ls", "--json")
	htok := dlq.TenantToken(hostile)
	for _, tok := range []string{"acme", htok} {
		same("peek "+tok, get("/dlq/"+tok+"?n=10"), "dlq", "peek", "--json", "-n", "10", "--tenant-token", tok)
		same("peek --raw "+tok, get("/dlq/"+tok+"?n=10&raw=1"), "dlq", "peek", "--json", "--raw", "-n", "10", "--tenant-token", tok)
	}

	json := map[string]string{"Accept": "application/json"}
	code, body := httpDo(t, "POST", u+"dlq/acme/replay", url.Values{"dry_run": {"1"}, "limit": {"2"}}, json)
	if code != 403 {
		t.Fatalf("POST without token: %d %s", code, body)
	}
	if n := counts(t, base)["acme"]; n != 3 {
		t.Fatalf("acme has %d after a refused POST, want 3", n)
	}
	auth := map[string]string{"Accept": "application/json", "Authorization": "Bearer " + token}
	code, body = httpDo(t, "POST", u+"dlq/acme/replay", url.Values{"dry_run": {"1"}, "limit": {"2"}}, auth)
	if code != 200 {
		t.Fatalf("dry run: %d %s", code, body)
	}
	cut := strings.LastIndex(strings.TrimSuffix(body, "\n"), "\n") + 1
	same("replay dry run", body[:cut], "dlq", "replay", "--json", "--dry-run", "--limit", "2", "--tenant-token", "acme")
	confirm := jsonLines[struct {
		Expect string `json:"expect"`
		Count  int    `json:"count"`
	}](t, body[cut:], "confirm")
	if len(confirm) != 1 || confirm[0].Count != 2 {
		t.Fatalf("confirm line %q", body[cut:])
	}
	code, body = httpDo(t, "POST", u+"dlq/acme/replay", url.Values{"expect": {confirm[0].Expect}, "limit": {"2"}}, auth)
	if code != 200 || !strings.Contains(body, `"type":"replay","tenant"`) || !strings.Contains(body, `"moved":2`) {
		t.Fatalf("replay: %d %s", code, body)
	}
	if n := counts(t, base)["acme"]; n != 1 {
		t.Fatalf("acme has %d after replaying 2 of 3", n)
	}
}

func TestConsoleKafka(t *testing.T) {
	addr := seedKafka(t)
	consoleMatchesCLI(t, []string{"--kafka", addr, "--topic", "orders"})
}

func TestConsoleNATS(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	q, err := rfnats.NewDLQ(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	seq := uint64(1)
	for tenant, n := range map[string]int{"acme": 3, hostile: 1} {
		for i := range n {
			err := q.Write(ctx, &dlq.Record{
				Tenant: tenant, Key: []byte(tenant), Value: []byte(tenant + " order " + string(rune('a'+i))),
				Source: "orders.eu", Offset: -1, Stream: "ORDERS", Sequence: seq, Group: "billing",
				Attempts: 2, FirstFailure: now.Add(-time.Minute), LastFailure: now,
				Error: "inventory service: 503", Reason: dlq.ReasonPoison,
			})
			if err != nil {
				t.Fatal(err)
			}
			seq++
		}
	}
	consoleMatchesCLI(t, []string{"--nats", srv.URL(), "--stream", rfnats.DefaultDLQStream})
}

// The printed URL carries a generated token, which signs in; --read-only
// prints none and refuses actions.
func TestConsoleTokenAndReadOnly(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := rfnats.NewDLQ(ctx, js); err != nil {
		t.Fatal(err)
	}
	base := []string{"--nats", srv.URL(), "--stream", rfnats.DefaultDLQStream}
	u := startConsole(t, base...)
	pu, err := url.Parse(u)
	if err != nil || len(pu.Query().Get("token")) < 32 || pu.Hostname() != "127.0.0.1" {
		t.Fatalf("printed URL %q", u)
	}
	code, _ := httpDo(t, "GET", u, nil, nil)
	if code != http.StatusSeeOther {
		t.Fatalf("sign-in: %d", code)
	}
	ro := startConsole(t, append([]string{"--read-only"}, base...)...)
	if strings.Contains(ro, "token") {
		t.Fatalf("read-only URL %q", ro)
	}
	code, _ = httpDo(t, "POST", ro+"dlq/acme/purge", url.Values{"dry_run": {"1"}}, map[string]string{"Authorization": "Bearer " + pu.Query().Get("token")})
	if code != http.StatusForbidden {
		t.Fatalf("read-only purge: %d", code)
	}
}

func TestConsoleUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--kafka", "nohost", "--topic", "orders"},
		{"--nats", "nats://127.0.0.1:1", "--stream", "a.b"},
		{"--nats", "nats://127.0.0.1:1", "--stream", "DLQ", "--addr", "nonsense"},
		{"--nats", "nats://127.0.0.1:1", "--stream", "DLQ", "--max-replay", "0"},
		{"--nats", "nats://127.0.0.1:1", "--stream", "DLQ", "extra"},
	} {
		var out, errb bytes.Buffer
		if code := runConsole(context.Background(), args, &out, &errb); code != 2 {
			t.Fatalf("%q: exit %d, want 2 (%s)", args, code, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := runConsole(context.Background(), []string{"--nats", "nats://127.0.0.1:1", "--stream", "DLQ", "--timeout", "5s"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "unreachable") {
		t.Fatalf("unreachable broker: exit %d: %s", code, errb.String())
	}
}

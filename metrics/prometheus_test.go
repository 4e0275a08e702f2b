package metrics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/metrics"
)

// TestPrometheusScrapesAndAlerts runs a real Prometheus against a consumer
// whose tenant "down" is in an outage (its breaker opens and it parks)
// while "acme" and "globex" are healthy. Prometheus scrapes the
// collector every second and evaluates the shipped rules, with every
// "for:" lowered to 1s so the test does not wait minutes; through its HTTP
// API the test sees down's time lag rise and its parked alert fire, and no
// alert for the healthy tenants.
func TestPrometheusScrapesAndAlerts(t *testing.T) {
	t.Parallel()
	bin := prometheusTool(t, "prometheus")

	var msgs [][2]string
	for _, tn := range []string{"acme", "globex", "down"} {
		for i := range 3 {
			msgs = append(msgs, [2]string{tn, strconv.Itoa(i)})
		}
	}
	c := settledConsumer(t, msgs, map[string]bool{"down": true}, func(s consumer.Stats) bool {
		return s.Handled == 6 && s.Parked == 3
	})
	col, err := metrics.NewCollector(c)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	target := serve(t, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ringfence.rules.yml"), rulesWithFor(t, "1s"), 0o644); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [ringfence.rules.yml]
scrape_configs:
  - job_name: ringfence
    static_configs:
      - targets: [%q]
`, target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	api := "http://" + freeAddr(t)
	var logs syncBuffer
	cmd := exec.Command(bin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+api[len("http://"):])
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus output:\n%s", logs.String())
		}
	})

	deadline := time.Now().Add(60 * time.Second)
	poll := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	var firing alert
	poll("RingfenceTenantParked to fire for down", func() bool {
		for _, a := range alerts(t, api) {
			if a.Labels["alertname"] == "RingfenceTenantParked" && a.Labels["tenant"] == "down" && a.State == "firing" {
				firing = a
				return true
			}
		}
		return false
	})
	b, _ := json.Marshal(firing)
	t.Logf("alert firing: %s", b)

	// down's time lag, seen twice: the second scrape's value is higher.
	lag := `ringfence_tenant_time_lag_seconds{job="ringfence",tenant="down"}`
	var first, second float64
	poll("down's time lag", func() bool {
		v, ok := instant(t, api, lag)
		first = v
		return ok && v > 0
	})
	poll("down's time lag to rise", func() bool {
		v, ok := instant(t, api, lag)
		second = v
		return ok && v > first
	})
	t.Logf("query %s: %.3fs, later %.3fs", lag, first, second)
	for _, healthy := range []string{"acme", "globex"} {
		q := fmt.Sprintf(`ringfence_tenant_time_lag_seconds{job="ringfence",tenant=%q}`, healthy)
		if v, ok := instant(t, api, q); !ok || v != 0 {
			t.Errorf("%s: %v (present %v), want 0", q, v, ok)
		}
	}
	// Seconds after down's alert fired, with every "for:" at 1s, the
	// healthy tenants have none, pending or firing.
	for _, a := range alerts(t, api) {
		if tn := a.Labels["tenant"]; tn != "" && tn != "down" {
			t.Errorf("alert for a healthy tenant: %+v", a)
		}
	}
}

type alert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	ActiveAt    time.Time         `json:"activeAt"`
	Value       string            `json:"value"`
}

// alerts returns Prometheus' pending and firing alerts (none while it is
// starting).
func alerts(t *testing.T, api string) []alert {
	t.Helper()
	var body struct {
		Data struct {
			Alerts []alert `json:"alerts"`
		} `json:"data"`
	}
	if !getJSON(t, api+"/api/v1/alerts", &body) {
		return nil
	}
	return body.Data.Alerts
}

// instant returns the value of a query that selects one series, and
// whether there was one.
func instant(t *testing.T, api, query string) (float64, bool) {
	t.Helper()
	var body struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if !getJSON(t, api+"/api/v1/query?query="+url.QueryEscape(query), &body) || len(body.Data.Result) != 1 {
		return 0, false
	}
	s, _ := body.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("%s: value %q: %v", query, s, err)
	}
	return v, true
}

// getJSON decodes a 200 answer into v; false while Prometheus is not
// answering yet.
func getJSON(t *testing.T, u string, v any) bool {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", u, err)
	}
	return true
}

// serve serves h on a free loopback port until the test ends and returns
// its address.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return ln.Addr().String()
}

// freeAddr returns a loopback address with a port free now, for a program
// that takes its listen address as a flag.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// syncBuffer collects a child process' output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

package demo

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/metrics"
)

// serveMetrics serves /metrics on addr. register adds the collector of a
// run's consumer, labelled with the broker and the mode, and returns its
// removal.
func serveMetrics(addr string, log *slog.Logger) (*http.Server, func(*consumer.Consumer, string, Mode) func(), error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("demo: metrics server stopped", "err", err)
		}
	}()
	register := func(c *consumer.Consumer, broker string, m Mode) func() {
		col, err := metrics.NewCollector(c, metrics.WithConstLabels(prometheus.Labels{"broker": broker, "run": m.String()}))
		if err == nil {
			err = reg.Register(col)
		}
		if err != nil {
			log.Warn("demo: metrics collector", "err", err)
			return func() {}
		}
		return func() { reg.Unregister(col) }
	}
	return srv, register, nil
}

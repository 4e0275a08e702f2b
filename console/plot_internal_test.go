package console

import (
	"testing"
	"time"
)

func TestSparkPath(t *testing.T) {
	t0 := time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)
	every := 2 * time.Second
	at := func(secs ...int) []time.Time {
		var out []time.Time
		for _, s := range secs {
			out = append(out, t0.Add(time.Duration(s)*time.Second))
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		at       []time.Time
		vals     []float64
		path     string
		max, now string
	}{
		{"nothing yet", nil, nil, "", "1/s", "-"},
		{"a lone point is a short stroke", at(240), []float64{5}, "M240.0,2.0h2", "5/s", "5/s"},
		{"left to right, zero at the bottom", at(236, 238, 240), []float64{0, 10, 20}, "M236.0,46.0L238.0,24.0L240.0,2.0", "20/s", "20/s"},
		{"a gap of more than two intervals breaks the line", at(0, 2, 100, 102), []float64{1, 1, 1, 1}, "M0.0,2.0L2.0,2.0M100.0,2.0L102.0,2.0", "1/s", "1/s"},
		{"the axis rounds up", at(238, 240), []float64{3, 0.5}, "M238.0,19.6L240.0,41.6", "5/s", "0.5/s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spark("goodput", "/s", tc.at, tc.vals, t0, 240*time.Second, every)
			if s.Path != tc.path || s.Max != tc.max || s.Last != tc.now {
				t.Fatalf("path %q max %q now %q, want %q %q %q", s.Path, s.Max, s.Last, tc.path, tc.max, tc.now)
			}
		})
	}
}

func TestAxisAndSpanText(t *testing.T) {
	for v, want := range map[float64]float64{0: 1, 0.3: 1, 1: 1, 1.5: 2, 3: 5, 7: 10, 10: 10, 11: 20, 480: 500, 501: 1000} {
		if got := niceCeil(v); got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", v, got, want)
		}
	}
	for d, want := range map[time.Duration]string{90 * time.Second: "90s", 5 * time.Minute: "5m", time.Hour: "1h", 90 * time.Minute: "1h30m"} {
		if got := spanText(d); got != want {
			t.Errorf("spanText(%v) = %q, want %q", d, got, want)
		}
	}
	for ns, want := range map[int64]string{0: "-", int64(850 * time.Millisecond): "850ms", int64(38 * time.Second): "38s", int64(125 * time.Second): "2m05s", int64(62 * time.Minute): "1h02m"} {
		if got := ageText(ns); got != want {
			t.Errorf("ageText(%v) = %q, want %q", time.Duration(ns), got, want)
		}
	}
}

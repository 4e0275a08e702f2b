package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// output returns benchmark lines for every figure of the table, as one
// process of scale would print them: every time and throughput is 1 for
// ringfence and scale for the alternatives, so each ratio reads scale.
func output(scale float64) string {
	var b strings.Builder
	line := func(name string, pairs ...any) {
		fmt.Fprintf(&b, "Benchmark%s-2 \t 1000\t", name)
		for i := 0; i < len(pairs); i += 2 {
			fmt.Fprintf(&b, " %v %s", pairs[i], pairs[i+1])
		}
		b.WriteString("\n")
	}
	for _, mode := range []string{"serial", "parallel"} {
		for _, r := range []string{"ringfence", "ringfence-default", "ringfence-recycled", "ringfence-timed"} {
			line("Success/"+r+"/"+mode, 10, "ns/op", 0, "B/op", 0, "allocs/op")
		}
		for _, r := range []string{"gobreaker", "failsafe"} {
			line("Success/"+r+"/"+mode, 10*scale, "ns/op", 0, "B/op", 17, "allocs/op")
		}
		line("Rejected/ringfence/"+mode, 10, "ns/op", 0, "allocs/op")
		line("Rejected/gobreaker/"+mode, 10*scale, "ns/op", 0, "allocs/op")
		line("AllowDone/ringfence-recycled/"+mode, 10, "ns/op", 0, "allocs/op")
		line("AllowDone/ringfence-recycled-batch8/"+mode, 10, "ns/op", 0, "allocs/op")
		line("Hit/scope.For/"+mode, 10, "ns/op", 0, "allocs/op")
		line("Hit/otter.Get/"+mode, 10*scale, "ns/op", 0, "allocs/op")
		line("Hit/rwmutex-map-gobreaker/"+mode, 10*scale, "ns/op", 0, "allocs/op")
	}
	line(churnScope, 100, "ns/op", 46, "B/op", 50, "p50-ns", 500, "p99.9-ns", 10, "p99.9/p50", 300, "floor-p99.9-ns")
	line(churnOtter, 100*scale, "ns/op", 797, "B/op", 50, "p50-ns", 500*scale, "p99.9-ns", 10, "p99.9/p50", 300, "floor-p99.9-ns")
	line(churnScope2, 100, "ns/op", 46, "B/op", 50, "p50-ns", 500, "p99.9-ns", 10, "p99.9/p50", 0.75, "hit-ratio", 300, "floor-p99.9-ns")
	line(churnOtter2, 100*scale, "ns/op", 797, "B/op", 50, "p50-ns", 500*scale, "p99.9-ns", 10, "p99.9/p50", 0.8, "hit-ratio", 300, "floor-p99.9-ns")
	for _, e := range []string{engine1000, engine1, engine10k, engine100k, engineZipfS, engineZipf, engine512, engineOnce} {
		faults := 1.0 // below faultsShown: not in the table
		if e == engineOnce {
			faults = 120 // a row allocating per message, on fresh memory
		}
		ns := 150.0
		if e == engine100k {
			ns = 750 // 600 ns more than the 1000-tenant row: 3 misses of 200
		}
		line(e, ns, "ns/op", 0, "allocs/op", 300, "cpu-ns/op", faults, "faults/kmsg", 400, "xcore-ns", 200, "miss-ns")
		line(e+"/gc=on", 150, "ns/op", 0, "allocs/op", 300, "cpu-ns/op", faults/10, "faults/kmsg", 400, "xcore-ns", 200, "miss-ns")
	}
	for _, order := range []string{"none/", "tenant/"} {
		for _, e := range []string{pipe1000, pipe100k, pipeZipfS} {
			ns := 100.0
			if e != pipe1000 {
				ns = 100 * scale
			}
			line(pipe+order+e, ns, "ns/op", 0, "allocs/op")
		}
	}
	for _, h := range []string{handlerWait, handlerCPU} {
		line(h+"bare-pool", 1000, "msgs/s")
		line(h+"engine", 1000*scale, "msgs/s")
	}
	for _, k := range []string{kEngine, kSource, kFloor, kGEngine, kGSource} {
		line(k, 1000*scale, "msgs/s", 800, "cpu-ns/msg", 1000*scale, "from-assign-msgs/s")
	}
	for _, k := range []string{kTEngine, kTSource, kTFloor} {
		line(k, 1000*scale, "msgs/s", 800, "cpu-ns/msg")
	}
	line(kReader, 1000, "msgs/s", 800, "cpu-ns/msg")
	line(kKgo, 1000, "msgs/s", 800, "cpu-ns/msg", 1000, "from-assign-msgs/s")
	line(kKgo1M, 2000, "msgs/s", 800, "cpu-ns/msg", 2000, "from-assign-msgs/s")
	line(nEngine, 1000*scale, "msgs/s", 7500, "cpu-ns/op")
	for _, n := range []string{nLoop, nNatsGo} {
		line(n, 1000, "msgs/s", 7500, "cpu-ns/op")
	}
	b.WriteString("PASS\nok  \tgithub.com/ringfence/ringfence/bench/policy\t1.0s\n")
	return b.String()
}

func samplesOf(t *testing.T, procs ...string) *samples {
	t.Helper()
	s := newSamples()
	for i, p := range procs {
		if err := s.read(strings.NewReader(p), i); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestTableRatios(t *testing.T) {
	var b strings.Builder
	if err := table(&b, samplesOf(t, output(4), output(2), output(3))); err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSpace(b.String()), "\n")
	if strings.Count(b.String(), "page faults") != 2 {
		t.Errorf("page faults shown %d times, want the distinct-keys row's two:\n%s", strings.Count(b.String(), "page faults"), b.String())
	}
	if len(rows) != 2+26 {
		t.Fatalf("%d lines, want a header, a rule and 26 rows:\n%s", len(rows), b.String())
	}
	for _, want := range []string{
		"| guard success path, parallel | 10.0 ns, 0 allocs | gobreaker 30.0 ns | 3.0x |",
		"| the same with `policy.Default()` as is (each attempt under its 10 s `AttemptTimeout`), serial | 10.0 ns, 0 allocs | gobreaker `Execute` 30.0 ns | 3.0x |",
		"| 3.0x; 3x |", // churn: the medians' ratios
		"3.000x from the rows' medians; 3.000 the median of the paired ratios (2.00-4.00)",
		"3.00x (4.000, 2.000, 3.000)", // the handler's paired ratios, in process order
		"3 processes x 1", "median of 3",
		"**3.00x** of kgo, the median of the per-process ratios over 3 processes, 3.00x (2.00-4.00); at 1 MiB 1.50x (1.00-2.00); from the rows' medians 3.00x of kgo",
		"(10.0x the median; 10.0-10.0x over 3 runs)", // churn: the tail ratio's median and range
		"the host's floor, a computation as long as the median miss timed the same way: p99.9 300 ns (300 ns-300 ns)",
		// page faults, shown only where they count: the distinct-keys row
		// with the collector off (120 a 1000 messages) and on (12)
		"`xcore-ns` 400-400; `miss-ns` 200-200; 120 page faults per 1000 messages; collector on 150.0 ns, 0 allocs, 12 page faults per 1000 messages |",
		// the 100,000-tenant row's time beyond the 1000-tenant row's, in
		// misses to memory
		"| 5.00x its time, 600 ns more (3.0 times `miss-ns`); collector on 1.00x |",
		// the reference pipeline's rows beside the engine's
		"| 100.0 / 300.0 / 300.0 ns; in order 100.0 / 300.0 / 300.0 ns; 0 allocs | the engine rows 150.0 / 750.0 / 150.0 ns | 100,000 / Zipf: 3.00x its 1000 row, 200 ns more / 3.00x, 200 ns more; in order 3.00x its 1000 row, 200 ns more / 3.00x, 200 ns more; the engine 600 / 0 ns more |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestTableGroupProcesses: processes that ran only the GroupSource engine
// and kgo's loop count in that row's per-process ratios, and the row says
// how many there were.
func TestTableGroupProcesses(t *testing.T) {
	extra := func(scale float64) string {
		return fmt.Sprintf("Benchmark%s-2 \t 1\t %v msgs/s 800 cpu-ns/msg %v from-assign-msgs/s\n", kGEngine, 1000*scale, 1000*scale) +
			fmt.Sprintf("Benchmark%s-2 \t 1\t 1000 msgs/s 800 cpu-ns/msg 1000 from-assign-msgs/s\n", kKgo)
	}
	var b strings.Builder
	if err := table(&b, samplesOf(t, output(4), output(2), output(3), extra(5), extra(6))); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"the processes above, and 2 more of this row and kgo's alone",
		"**4.00x** of kgo, the median of the per-process ratios over 5 processes, 4.00x (2.00-6.00)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestTableMissingFigure(t *testing.T) {
	out := output(2)
	var kept []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.Contains(l, "franz-go-kgo") {
			kept = append(kept, l)
		}
	}
	var b strings.Builder
	err := table(&b, samplesOf(t, strings.Join(kept, "\n")))
	if err == nil || !strings.Contains(err.Error(), "franz-go-kgo") {
		t.Fatalf("err = %v, want one naming the missing row", err)
	}
	if b.Len() != 0 {
		t.Errorf("printed a table with a figure missing:\n%s", b.String())
	}
}

func TestReadStripsProcsSuffix(t *testing.T) {
	s := samplesOf(t, "BenchmarkSpill/refeed-window-64-2 \t 50\t 12.5 ns/op\n"+
		"BenchmarkEngine/tenants=1/partitions=1/concurrency=1-16   300000   95.3 ns/op   0 allocs/op\n")
	if v := s.med("Spill/refeed-window-64", "ns/op"); v != 12.5 {
		t.Errorf("refeed-window-64: %v, want 12.5", v)
	}
	if v := s.med(engine1, "N"); v != 300000 {
		t.Errorf("iterations: %v, want 300000", v)
	}
	if s.err != nil {
		t.Error(s.err)
	}
	if v := s.med("Nothing", "ns/op"); !math.IsNaN(v) || s.err == nil {
		t.Errorf("a missing figure: %v, err %v", v, s.err)
	}
}

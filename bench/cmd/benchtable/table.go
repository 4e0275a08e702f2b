package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Benchmark names, without the "Benchmark" prefix and GOMAXPROCS suffix.
const (
	engine1000  = "Engine/tenants=1000/partitions=4/concurrency=64"
	engine1     = "Engine/tenants=1/partitions=1/concurrency=1"
	engine10k   = "Engine/tenants=10000/partitions=4/concurrency=64"
	engine100k  = "Engine/tenants=100000/partitions=4/concurrency=64"
	engineZipfS = "Engine/tenants=100000/zipf=1.1/partitions=4/concurrency=64"
	engineZipf  = "Engine/tenants=1000000/zipf=1.1/partitions=4/concurrency=64"
	engine512   = "Engine/tenants=1000/partitions=512/concurrency=64"
	engineOnce  = "Engine/tenants=distinct/partitions=4/concurrency=64"
	pipe        = "TenantPipeline/order=" // then none/ or tenant/, and one of:
	pipe1000    = "tenants=1000/partitions=4"
	pipe100k    = "tenants=100000/partitions=4"
	pipeZipfS   = "tenants=100000/zipf=1.1/partitions=4"
	kEngine     = "Consume/ringfence-engine"
	kSource     = "Consume/ringfence-source"
	kFloor      = "Consume/handoff-floor"
	kReader     = "Consume/kafka-go-reader"
	kKgo        = "Consume/franz-go-kgo"
	kKgo1M      = "Consume/franz-go-kgo-1mib"
	kTEngine    = "ConsumeTenants/ringfence-engine"
	kTSource    = "ConsumeTenants/ringfence-source"
	kTFloor     = "ConsumeTenants/handoff-floor"
	kGEngine    = "Consume/ringfence-group-engine"
	kGSource    = "Consume/ringfence-group-source"
	nEngine     = "Consume/ringfence-Source-engine"
	nLoop       = "Consume/ringfence-Source-loop"
	nNatsGo     = "Consume/nats.go-Consume-Ack"
	churnScope  = "Churn/zipf=1.01/scope.For/serial"
	churnOtter  = "Churn/zipf=1.01/otter.Get/serial"
	churnScope2 = "Churn/zipf=1.2/scope.For/serial"
	churnOtter2 = "Churn/zipf=1.2/otter.Get/serial"
	handlerWait = "Handler/wait-50us/"
	handlerCPU  = "Handler/cpu-50us/"
)

// table writes the published table from s: one row per comparison, the
// ratio column ringfence's throughput (or the alternative's time) over the
// alternative's, so above 1 is better for ringfence. It returns the first
// figure it found missing.
func table(w io.Writer, s *samples) error {
	ns := func(name string) float64 { return s.med(name, "ns/op") }
	allocs := func(name string) string { return strconv.FormatFloat(s.med(name, "allocs/op"), 'f', 0, 64) + " allocs" }
	gb := func(mode string) float64 { return ns("Success/gobreaker/" + mode) }

	rows := [][4]string{
		{
			"guard success path, serial (breaker + retry + budget + latency estimate)",
			fmt.Sprintf("%.1f ns, %s", ns("Success/ringfence/serial"), allocs("Success/ringfence/serial")),
			fmt.Sprintf("gobreaker `Execute` %.1f ns", gb("serial")),
			x1(gb("serial") / ns("Success/ringfence/serial")),
		},
		{
			"the same with `policy.Default()` as is (each attempt under its 10 s `AttemptTimeout`), serial",
			fmt.Sprintf("%.1f ns, %s", ns("Success/ringfence-default/serial"), allocs("Success/ringfence-default/serial")),
			fmt.Sprintf("gobreaker `Execute` %.1f ns", gb("serial")),
			x1(gb("serial") / ns("Success/ringfence-default/serial")),
		},
		{
			"guard success path, parallel",
			fmt.Sprintf("%.1f ns, %s", ns("Success/ringfence/parallel"), allocs("Success/ringfence/parallel")),
			fmt.Sprintf("gobreaker %.1f ns", gb("parallel")),
			x1(gb("parallel") / ns("Success/ringfence/parallel")),
		},
		{
			"the same, guard from a scope (recycled state), serial / parallel",
			fmt.Sprintf("%.1f / %.1f ns, %s", ns("Success/ringfence-recycled/serial"), ns("Success/ringfence-recycled/parallel"), allocs("Success/ringfence-recycled/serial")),
			fmt.Sprintf("gobreaker %.1f / %.1f ns", gb("serial"), gb("parallel")),
			x1(gb("serial")/ns("Success/ringfence-recycled/serial")) + " / " + x1(gb("parallel")/ns("Success/ringfence-recycled/parallel")),
		},
		{
			"`Allow` + `Done` on a guard from a scope, one by one / in a `Batch` of 8 (as the engine runs a lane), serial / parallel",
			fmt.Sprintf("%.1f / %.1f ns; batch %.1f / %.1f ns, %s",
				ns("AllowDone/ringfence-recycled/serial"), ns("AllowDone/ringfence-recycled/parallel"),
				ns("AllowDone/ringfence-recycled-batch8/serial"), ns("AllowDone/ringfence-recycled-batch8/parallel"),
				allocs("AllowDone/ringfence-recycled/serial")),
			fmt.Sprintf("gobreaker %.1f / %.1f ns", gb("serial"), gb("parallel")),
			fmt.Sprintf("%s / %s; batch %s / %s",
				x1(gb("serial")/ns("AllowDone/ringfence-recycled/serial")), x1(gb("parallel")/ns("AllowDone/ringfence-recycled/parallel")),
				x1(gb("serial")/ns("AllowDone/ringfence-recycled-batch8/serial")), x1(gb("parallel")/ns("AllowDone/ringfence-recycled-batch8/parallel"))),
		},
		{
			"guard success path, serial, every attempt timed",
			fmt.Sprintf("%.1f ns, %s", ns("Success/ringfence-timed/serial"), allocs("Success/ringfence-timed/serial")),
			fmt.Sprintf("gobreaker %.1f ns", gb("serial")),
			x1(gb("serial") / ns("Success/ringfence-timed/serial")),
		},
		{
			"guard success path, serial",
			fmt.Sprintf("%.1f ns", ns("Success/ringfence/serial")),
			fmt.Sprintf("failsafe-go retry + breaker %.1f ns, %s", ns("Success/failsafe/serial"), allocs("Success/failsafe/serial")),
			x1(ns("Success/failsafe/serial") / ns("Success/ringfence/serial")),
		},
		{
			"open-breaker rejection, serial",
			fmt.Sprintf("%.1f ns, %s", ns("Rejected/ringfence/serial"), allocs("Rejected/ringfence/serial")),
			fmt.Sprintf("gobreaker %.1f ns", ns("Rejected/gobreaker/serial")),
			x1(ns("Rejected/gobreaker/serial") / ns("Rejected/ringfence/serial")),
		},
		{
			"`Scope.For` hit, parallel",
			fmt.Sprintf("%.1f ns, %s", ns("Hit/scope.For/parallel"), allocs("Hit/scope.For/parallel")),
			fmt.Sprintf("otter `Get` %.1f ns; `RWMutex` + map of gobreakers %.1f ns", ns("Hit/otter.Get/parallel"), ns("Hit/rwmutex-map-gobreaker/parallel")),
			x1(ns("Hit/otter.Get/parallel")/ns("Hit/scope.For/parallel")) + "; " + x1(ns("Hit/rwmutex-map-gobreaker/parallel")/ns("Hit/scope.For/parallel")),
		},
		{
			"`Scope.For` under churn (Zipf 1.01 over 1M keys, 1024 kept), serial",
			churnCell(s, churnScope),
			"otter `Get` with a loader " + churnCell(s, churnOtter),
			fmt.Sprintf("%.1fx; %.0fx", ns(churnOtter)/ns(churnScope), s.med(churnOtter, "p99.9-ns")/s.med(churnScope, "p99.9-ns")),
		},
		{
			fmt.Sprintf("the same at Zipf 1.2 (hit ratio %.3f; otter %.3f)", s.med(churnScope2, "hit-ratio"), s.med(churnOtter2, "hit-ratio")),
			churnCell(s, churnScope2),
			"otter `Get` with a loader " + churnCell(s, churnOtter2),
			fmt.Sprintf("%.1fx; %.0fx", ns(churnOtter2)/ns(churnScope2), s.med(churnOtter2, "p99.9-ns")/s.med(churnScope2, "p99.9-ns")),
		},
		{
			fmt.Sprintf("engine overhead per message, no-op handler, 1000 tenants (each seen once before the timer), 4 partitions, 64 workers, batches of 64, median of %d", s.count(engine1000, "ns/op")),
			engineCell(s, engine1000),
			"none to compare with", "",
		},
		{
			fmt.Sprintf("the same, 1 tenant, 1 partition, 1 worker, median of %d", s.count(engine1, "ns/op")),
			engineCell(s, engine1),
			"", "",
		},
		scaleRow(s, engine10k, "the 1000-tenant row with 10,000 tenants (each seen once before the timer)"),
		scaleRow(s, engine100k, "with 100,000 tenants (each seen once before the timer)"),
		scaleRow(s, engineZipfS, "with tenants drawn from Zipf(1.1) over 100,000 keys (each seen once before the timer)"),
		pipelineRow(s),
		scaleRow(s, engineZipf, "with tenants drawn from Zipf(1.1) over 1,000,000 keys, most seen once"),
		scaleRow(s, engine512, "with 1000 tenants over 512 partitions (each tenant seen and each partition fed before the timer)"),
		scaleRow(s, engineOnce, "with every message a tenant never seen before, default Config (1024 guards and idle tenants kept)"),
		handlerRow(s, handlerWait, fmt.Sprintf("handler that waits 50 µs for a dependency, 1000 tenants, 64 workers, %d processes, median of the paired ratios", s.procs(handlerWait+"engine", "msgs/s")), "a bare pool of 64 goroutines over the same source"),
		handlerRow(s, handlerCPU, "handler that computes for 50 µs (2 cores: at most 40k msg/s)", "bare pool"),
		kafkaRow(s),
		kafkaTenantsRow(s),
		kafkaGroupRow(s),
		natsRow(s),
	}
	if s.err != nil {
		return s.err
	}
	fmt.Fprintln(w, "| what | ringfence | alternative | ratio |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", r[0], r[1], r[2], r[3])
	}
	return nil
}

// churnCell is a churn row's medians over its runs, and the range of its
// tail ratio if it ran more than once.
func churnCell(s *samples, name string) string {
	p50, p999 := s.med(name, "p50-ns"), s.med(name, "p99.9-ns")
	ratio := fmt.Sprintf("%.1fx the median", s.med(name, "p99.9/p50"))
	if n := s.count(name, "p99.9/p50"); n > 1 {
		lo, hi := s.span(name, "p99.9/p50")
		ratio += fmt.Sprintf("; %.1f-%.1fx over %d runs", lo, hi, n)
	}
	cell := fmt.Sprintf("%.0f ns/op, %.0f B/op; p50 %s, p99.9 %s (%s)",
		s.med(name, "ns/op"), s.med(name, "B/op"), dur(p50), dur(p999), ratio)
	lo, hi := s.span(name, "floor-p99.9-ns")
	return cell + fmt.Sprintf("; the host's floor, a computation as long as the median miss timed the same way: p99.9 %s (%s-%s)",
		dur(s.med(name, "floor-p99.9-ns")), dur(lo), dur(hi))
}

func engineCell(s *samples, name string) string {
	lo, hi := s.span(name, "ns/op")
	xlo, xhi := s.span(name, "xcore-ns")
	mlo, mhi := s.span(name, "miss-ns")
	cell := fmt.Sprintf("%.1f ns (%.1f-%.1f), %s allocs; %.0f ns of CPU; `xcore-ns` %.0f-%.0f; `miss-ns` %.0f-%.0f",
		s.med(name, "ns/op"), lo, hi, strconv.FormatFloat(s.med(name, "allocs/op"), 'f', 0, 64), s.med(name, "cpu-ns/op"), xlo, xhi, mlo, mhi)
	if f := faults(s, name); f != "" {
		cell += "; " + f
	}
	return cell
}

// faultsShown is the page faults per 1000 messages from which an engine
// cell shows them: a row that allocates per message runs on fresh memory
// with the collector off, each page faulted in, where the collector would
// have reused it.
const faultsShown = 10

// scaleRow is an engine row of many tenants or partitions beside the
// 1000-tenant row, with the collector off and on.
func scaleRow(s *samples, name, what string) [4]string {
	on := name + "/gc=on"
	onFaults := faults(s, on)
	if onFaults != "" {
		onFaults = ", " + onFaults
	}
	// The time a message takes beyond the 1000-tenant row's, in misses to
	// memory: what the state of tenants the caches cannot hold costs.
	more := s.med(name, "ns/op") - s.med(engine1000, "ns/op")
	return [4]string{
		fmt.Sprintf("engine overhead per message, %s, median of %d", what, s.count(name, "ns/op")),
		fmt.Sprintf("%s; collector on %.1f ns, %s allocs%s", engineCell(s, name), s.med(on, "ns/op"), strconv.FormatFloat(s.med(on, "allocs/op"), 'f', 0, 64), onFaults),
		fmt.Sprintf("the 1000-tenant row %.1f ns; collector on %.1f ns", s.med(engine1000, "ns/op"), s.med(engine1000+"/gc=on", "ns/op")),
		fmt.Sprintf("%.2fx its time, %.0f ns more (%.1f times `miss-ns`); collector on %.2fx",
			s.med(name, "ns/op")/s.med(engine1000, "ns/op"), more, more/s.med(name, "miss-ns"),
			s.med(on, "ns/op")/s.med(engine1000+"/gc=on", "ns/op")),
	}
}

// pipelineRow is the reference for the rows of many tenants: a pipeline
// that does nothing but find each message's tenant and call its guard
// (and, with order=tenant, keep each tenant's order), over the same
// messages as the engine rows. What it costs at 100,000 tenants beyond
// 1,000 is what the tenants' state costs alone; the engine rows' cost
// beyond that is the engine's own.
func pipelineRow(s *samples) [4]string {
	ns := func(name string) float64 { return s.med(name, "ns/op") }
	cell := func(order string) string {
		p := pipe + order + "/"
		return fmt.Sprintf("%.1f / %.1f / %.1f ns", ns(p+pipe1000), ns(p+pipe100k), ns(p+pipeZipfS))
	}
	more := func(order string) string {
		p := pipe + order + "/"
		return fmt.Sprintf("%.2fx its 1000 row, %.0f ns more / %.2fx, %.0f ns more",
			ns(p+pipe100k)/ns(p+pipe1000), ns(p+pipe100k)-ns(p+pipe1000),
			ns(p+pipeZipfS)/ns(p+pipe1000), ns(p+pipeZipfS)-ns(p+pipe1000))
	}
	return [4]string{
		fmt.Sprintf("reference for the two rows above: a pipeline that only looks each message's tenant up (a map, on the delivering goroutine) and calls its guard (on the workers, batches handed over a channel), no lanes, bounds or commits; then the same keeping each tenant's order (a queue and a mutex in the tenant); 1000 tenants / 100,000 round-robin / Zipf(1.1) over 100,000, the engine rows' messages, median of %d", s.count(pipe+"none/"+pipe1000, "ns/op")),
		fmt.Sprintf("%s; in order %s; %s allocs", cell("none"), cell("tenant"), strconv.FormatFloat(s.med(pipe+"tenant/"+pipe100k, "allocs/op"), 'f', 0, 64)),
		fmt.Sprintf("the engine rows %.1f / %.1f / %.1f ns", ns(engine1000), ns(engine100k), ns(engineZipfS)),
		fmt.Sprintf("100,000 / Zipf: %s; in order %s; the engine %.0f / %.0f ns more",
			more("none"), more("tenant"), ns(engine100k)-ns(engine1000), ns(engineZipfS)-ns(engine1000)),
	}
}

// faults is name's page faults as a cell says them, or "" below
// faultsShown.
func faults(s *samples, name string) string {
	if f := s.med(name, "faults/kmsg"); f >= faultsShown {
		return fmt.Sprintf("%.0f page faults per 1000 messages", f)
	}
	return ""
}

func handlerRow(s *samples, prefix, what, alt string) [4]string {
	paired := s.paired(prefix+"engine", prefix+"bare-pool", "msgs/s")
	each := make([]string, len(paired))
	for i, r := range paired {
		each[i] = fmt.Sprintf("%.3f", r)
	}
	ratio := fmt.Sprintf("%.2fx", median(paired))
	if len(paired) > 1 {
		ratio += " (" + strings.Join(each, ", ") + ")"
	}
	return [4]string{
		what,
		fmt.Sprintf("%s msg/s", thousands(s.med(prefix+"engine", "msgs/s"))),
		fmt.Sprintf("%s %s msg/s", alt, thousands(s.med(prefix+"bare-pool", "msgs/s"))),
		ratio,
	}
}

func kafkaRow(s *samples) [4]string {
	procs := s.procs(kEngine, "msgs/s")
	n := s.count(kEngine, "msgs/s")
	rate := func(name string) float64 { return s.med(name, "msgs/s") }
	cpu := func(name string) string { return thousands(s.med(name, "cpu-ns/msg")) }
	perProc := func(a, b string) string {
		r := s.paired(a, b, "msgs/s")
		if len(r) == 0 {
			return ""
		}
		lo, hi := r[0], r[0]
		for _, v := range r {
			lo, hi = min(lo, v), max(hi, v)
		}
		return fmt.Sprintf("%.2fx (%.2f-%.2f)", median(r), lo, hi)
	}
	return [4]string{
		fmt.Sprintf("Kafka: consume 1M messages on kfake (20 tenants), no-op handler, engine included, %d processes x %d (after two unmeasured reads of the topic), median of %d", procs, n/max(procs, 1), n),
		fmt.Sprintf("%s msg/s; %s ns of CPU a message", thousands(rate(kEngine)), cpu(kEngine)),
		fmt.Sprintf("kafka-go group `Reader` %s msg/s (%s ns CPU); franz-go `kgo` group `PollFetches` %s msg/s (%s ns CPU); the source alone %s (%s ns CPU); the source with each delivered slice handed whole to one goroutine (`handoff-floor`) %s (%s ns CPU)",
			thousands(rate(kReader)), cpu(kReader), thousands(rate(kKgo)), cpu(kKgo),
			thousands(rate(kSource)), cpu(kSource), thousands(rate(kFloor)), cpu(kFloor)),
		fmt.Sprintf("from the rows' medians %.2fx, %.2fx, **%.2fx** of the source; medians of the per-process ratios %s, %s, %s; the floor %.2fx of the source",
			rate(kEngine)/rate(kReader), rate(kEngine)/rate(kKgo), rate(kEngine)/rate(kSource),
			perProc(kEngine, kReader), perProc(kEngine, kKgo), perProc(kEngine, kSource),
			rate(kFloor)/rate(kSource)),
	}
}

func kafkaTenantsRow(s *samples) [4]string {
	rate := func(name string) float64 { return s.med(name, "msgs/s") }
	cpu := func(name string) string { return thousands(s.med(name, "cpu-ns/msg")) }
	r := s.paired(kTEngine, kTSource, "msgs/s")
	lo, hi := math.NaN(), math.NaN()
	if len(r) > 0 {
		lo, hi = slices.Min(r), slices.Max(r)
	}
	return [4]string{
		fmt.Sprintf("the same over a topic of 100k messages, each its own tenant (100,000 tenants, default Config: 1024 kept), %d processes, median of %d", s.procs(kTEngine, "msgs/s"), s.count(kTEngine, "msgs/s")),
		fmt.Sprintf("%s msg/s; %s ns of CPU a message", thousands(rate(kTEngine)), cpu(kTEngine)),
		fmt.Sprintf("the source alone %s (%s ns CPU); `handoff-floor` %s (%s ns CPU)", thousands(rate(kTSource)), cpu(kTSource), thousands(rate(kTFloor)), cpu(kTFloor)),
		fmt.Sprintf("**%.2fx** of the source from the rows' medians; median of the per-process ratios %.2fx (%.2f-%.2f)", rate(kTEngine)/rate(kTSource), median(r), lo, hi),
	}
}

// kafkaGroupRow is the engine on kafka.GroupSource (the group run by kgo)
// beside kgo's own poll loop, with its defaults and with a fetch of 1 MiB
// in all, and the kafka-go source's engine row beside them.
func kafkaGroupRow(s *samples) [4]string {
	rate := func(name string) float64 { return s.med(name, "msgs/s") }
	cpu := func(name string) string { return thousands(s.med(name, "cpu-ns/msg")) }
	perProc := func(b string) string {
		r := s.paired(kGEngine, b, "msgs/s")
		if len(r) == 0 {
			return "NaN"
		}
		return fmt.Sprintf("%.2fx (%.2f-%.2f)", median(r), slices.Min(r), slices.Max(r))
	}
	assign := func(name string) float64 { return s.med(name, "from-assign-msgs/s") }
	kgo := s.paired(kGEngine, kKgo, "msgs/s")
	head := math.NaN()
	if len(kgo) > 0 {
		head = median(kgo)
	}
	return [4]string{
		fmt.Sprintf("Kafka, the same on `kafka.GroupSource` (the group on kgo, cooperative rebalancing; each partition fetched on a client of its own): the processes above, and %d more of this row and kgo's alone", s.procs(kGEngine, "msgs/s")-s.procs(kEngine, "msgs/s")),
		fmt.Sprintf("%s msg/s; %s ns of CPU a message", thousands(rate(kGEngine)), cpu(kGEngine)),
		fmt.Sprintf("franz-go `kgo` group `PollFetches` %s msg/s (%s ns CPU); the same with `FetchMaxBytes` 1 MiB %s (%s ns CPU); the GroupSource alone %s (%s ns CPU); the kafka-go source's engine %s (%s ns CPU)",
			thousands(rate(kKgo)), cpu(kKgo), thousands(rate(kKgo1M)), cpu(kKgo1M),
			thousands(rate(kGSource)), cpu(kGSource), thousands(rate(kEngine)), cpu(kEngine)),
		fmt.Sprintf("**%.2fx** of kgo, the median of the per-process ratios over %d processes, %s; at 1 MiB %s; from the rows' medians %.2fx of kgo, %.2fx of kgo at 1 MiB, %.2fx of the GroupSource; counted from the partitions' assignment to the last message (`from-assign-msgs/s`: group join left out, kgo's first fetch in) %.2fx of kgo, %.2fx at 1 MiB",
			head, len(kgo), perProc(kKgo), perProc(kKgo1M),
			rate(kGEngine)/rate(kKgo), rate(kGEngine)/rate(kKgo1M), rate(kGEngine)/rate(kGSource),
			assign(kGEngine)/assign(kKgo), assign(kGEngine)/assign(kKgo1M)),
	}
}

func natsRow(s *samples) [4]string {
	rate := func(name string) float64 { return s.med(name, "msgs/s") }
	paired := s.paired(nEngine, nNatsGo, "msgs/s")
	lo, hi := 0.0, 0.0
	if len(paired) > 0 {
		lo, hi = paired[0], paired[0]
		for _, v := range paired {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	return [4]string{
		fmt.Sprintf("NATS: consume %s messages on nats-server, no-op handler, engine included, %d processes, median", thousands(s.med(nEngine, "N")), s.procs(nEngine, "msgs/s")),
		fmt.Sprintf("%s msg/s; %s of CPU a message (server included)", thousands(rate(nEngine)), dur(s.med(nEngine, "cpu-ns/op"))),
		fmt.Sprintf("nats.go `Consume` + `Ack` %s msg/s, %s CPU (same processes); the source loop alone %s", thousands(rate(nNatsGo)), dur(s.med(nNatsGo, "cpu-ns/op")), thousands(rate(nLoop))),
		fmt.Sprintf("%.3fx from the rows' medians; %.3f the median of the paired ratios (%.2f-%.2f); the source loop %.2fx",
			rate(nEngine)/rate(nNatsGo), median(paired), lo, hi, rate(nLoop)/rate(nNatsGo)),
	}
}

// x1 formats a ratio with one decimal.
func x1(r float64) string { return fmt.Sprintf("%.1fx", r) }

// dur formats nanoseconds with about three significant digits.
func dur(ns float64) string {
	v, unit := ns, "ns"
	switch {
	case ns >= 1e6:
		v, unit = ns/1e6, "ms"
	case ns >= 1e3:
		v, unit = ns/1e3, "µs"
	}
	switch {
	case v >= 100 || unit == "ns":
		return fmt.Sprintf("%.0f %s", v, unit)
	case v >= 10:
		return fmt.Sprintf("%.1f %s", v, unit)
	default:
		return fmt.Sprintf("%.2f %s", v, unit)
	}
}

// thousands formats v rounded to an integer, with commas between groups
// of three digits.
func thousands(v float64) string {
	d := strconv.FormatFloat(v, 'f', 0, 64)
	neg := strings.HasPrefix(d, "-")
	d = strings.TrimPrefix(d, "-")
	var b strings.Builder
	for i, c := range d {
		if i > 0 && (len(d)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

package demo

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ringfence/ringfence/console"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/policy"
)

// Options are the demo's settings, filled from flags by Main.
type Options struct {
	// Brokers lists the brokers to run on, in order: "kafka", "nats",
	// "memory".
	Brokers []string
	// Scenario is the traffic and the fault.
	Scenario Scenario
	// Modes are the runs per broker, in order; nil means the scenario's
	// (baseline and ringfence, and the shared breaker for outage). The
	// baseline always runs: every figure is compared with it.
	Modes []Mode
	// LagBound is the largest commit lag the long-outage check accepts;
	// zero means LongOutageMaxLag.
	LagBound int64
	// HeapBudget, if set, makes the check fail when the ringfence run's
	// consumer heap grew by more.
	HeapBudget uint64
	// KafkaAddr is a real Kafka's host:port; empty starts kfake in a child
	// process.
	KafkaAddr string
	// NATSURL is a real NATS server's URL; empty starts one in a child
	// process.
	NATSURL string
	// MetricsAddr, if set, serves Prometheus metrics of the running
	// consumer at http://MetricsAddr/metrics.
	MetricsAddr string
	// ConsoleAddr, if set, serves the ops console's tenant view of the
	// running consumer at http://ConsoleAddr/ while the demo runs.
	ConsoleAddr string
	// Traces, if set, prints the traces of that many of the bad tenant's
	// messages (those that parked or spilled first) after each ringfence
	// run, as trees, recorded with the OpenTelemetry SDK in memory.
	Traces int
	// JSON prints one JSON object per broker instead of tables.
	JSON bool
	// Check makes Run fail when a broker's results are not as expected.
	Check bool
	// TTY draws the live per-tenant view in place (else plain lines).
	TTY bool
	// Logger receives the library's logs; nil discards them.
	Logger *slog.Logger
	// Stdout gets the tables or JSON; Progress the live view.
	Stdout, Progress io.Writer
}

// errUsage marks a bad command line (exit code 2).
var errUsage = errors.New("demo: usage")

// errCheck marks results that are not as expected (--check).
var errCheck = errors.New("demo: results not as expected")

// brokerFactory starts (addr empty) or connects to a broker.
type brokerFactory func(ctx context.Context, addr string, log *slog.Logger) (Broker, error)

// factories are the brokers the demo knows; kafka.go and nats.go add theirs.
var factories = map[string]brokerFactory{
	"memory": func(context.Context, string, *slog.Logger) (Broker, error) { return memBroker{}, nil },
}

// Main runs `ringfence demo` with args and returns the exit code: 0 on
// success, 1 on failure (or, with --check, results not as expected), 2 on a
// usage error.
func Main(args []string, stdout, stderr io.Writer) int {
	if code, ok := ServeChild(); ok {
		return code
	}
	opts, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	opts.Stdout = stdout
	opts.Progress = stdout
	if opts.JSON {
		opts.Progress = stderr
		opts.TTY = isTerminal(stderr)
	} else {
		opts.TTY = isTerminal(stdout)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := Run(ctx, opts); err != nil {
		fmt.Fprintln(stderr, "ringfence demo:", err)
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (Options, error) {
	fs := flag.NewFlagSet("ringfence demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	broker := fs.String("broker", "both", "broker(s) to run on: kafka, nats or both (memory: in-process stand-in, for development)")
	scenario := fs.String("scenario", "outage", "the fault: outage, long-outage, slow, hang, hot, poison-burst or dlq-outage")
	tenants := fs.Int("tenants", 20, "number of tenants sending traffic (at least 3)")
	rate := fs.Int("rate", 25, "messages per second per tenant (the bad tenant sends 4x)")
	partitions := fs.Int("partitions", 4, "partitions of the Kafka topic (tenants are keyed onto them by hash)")
	duration := fs.Duration("duration", 0, "traffic time of each run (default: 8s for outage; for the others the fault plus a lead and a tail)")
	var fault time.Duration
	fs.DurationVar(&fault, "fault", 0, "length of the fault window (default: outage 40% of the duration, long-outage 5m, slow, hang and poison-burst 30s, hot and dlq-outage 60s)")
	fs.DurationVar(&fault, "outage", 0, "same as --fault (for long-outage: how long the dependency is down)")
	slowLatency := fs.Duration("slow-latency", 500*time.Millisecond, "slow: how long the bad tenant's calls take during the fault")
	latency := fs.Duration("latency", time.Millisecond, "the simulated dependency's least latency: each ordinary call takes between it and twice it; 0 returns at once (calls of microseconds, which the engine runs as quick tenants)")
	hotFactor := fs.Int("hot-factor", 20, "hot: how many times its rate the bad tenant sends during the fault")
	pol := fs.String("policy", "", "guard template: demo (fast breaker, 1s deadline) or default (policy.Default()); default: demo for outage and long-outage, default for the others")
	shared := fs.Bool("shared", false, "also run the shared-breaker comparison (default: only for outage)")
	settle := fs.Duration("settle", 30*time.Second, "the run's deadline after production ends; what is not done then is 'unfinished at deadline'")
	drain := fs.Duration("drain", 0, "how long to keep consuming after the deadline while progress is made (default 5m; hot: longer when its fault traffic needs it, 3x the latency a message)")
	lagBound := fs.Int64("lag-bound", LongOutageMaxLag, "long-outage --check: the largest commit lag (messages) accepted during the outage (0: the busiest partition's messages in the engine's StuckAfter + 1s)")
	heapBudget := fs.String("heap-budget", "", "--check fails if the consumer's heap grows by more than this during the ringfence run (e.g. 64MiB; default: reported only)")
	kafkaAddr := fs.String("kafka", "", "HOST:PORT of a real Kafka broker (default: start kfake in a child process)")
	natsURL := fs.String("nats", "", "URL of a real NATS server with JetStream (default: start one in a child process)")
	consoleAddr := fs.String("console", "", "serve the ops console at ADDR while the demo runs, to watch a tenant park, spill and recover live (e.g. 127.0.0.1:8089)")
	traces := fs.Int("traces", 0, "after the ringfence run, print N of the bad tenant's messages' traces as trees (a message that parked, spilled and came back), recorded with the OpenTelemetry SDK in memory")
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics at ADDR/metrics while the demo runs (e.g. 127.0.0.1:9464)")
	asJSON := fs.Bool("json", false, "print one JSON object per broker instead of tables")
	check := fs.Bool("check", false, "exit 1 unless the scenario's acceptance checks pass (see the summary's checks)")
	verbose := fs.Bool("v", false, "log the library's warnings (slog) to stderr")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: ringfence demo [flags]

Runs the noisy-neighbour demo on in-process Kafka and NATS (each in a child
process, so the heap figures are the consumer's): traffic for many tenants
keyed onto partitions, one bad tenant, and a fault for it (--scenario):

  outage        its dependency fails for a few seconds (with the shared-breaker comparison)
  long-outage   its dependency fails for --outage (5m by default)
  slow          its calls take 500ms instead of failing
  hang          its calls block until cancelled
  hot           it sends 20x its rate, every call succeeding
  poison-burst  every message it sends for 30s is poison (policy.Permanent)
  dlq-outage    every message it sends for 60s is poison, while the DLQ refuses writes

Each scenario runs with no fault (the baseline) and with per-tenant guards;
the summary compares goodput, p99 latency, commit lag, heap, parking, dead
letters, order and losses, and --check judges them.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return Options{}, err
	}
	if fs.NArg() > 0 {
		return Options{}, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	kind, err := ParseKind(*scenario)
	if err != nil {
		return Options{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	sc := Scenario{
		Kind: kind, Tenants: *tenants, Rate: *rate, Partitions: *partitions, Duration: *duration,
		Fault: fault, SlowLatency: *slowLatency, HotFactor: *hotFactor, Settle: *settle, Drain: *drain,
		Latency: *latency, Instant: *latency == 0,
	}
	switch *pol {
	case "":
	case "demo":
		p := DemoPolicy()
		sc.Policy, sc.PolicyName = &p, "demo"
	case "default":
		p := policy.Default()
		sc.Policy, sc.PolicyName = &p, "default"
	default:
		return Options{}, fmt.Errorf("%w: --policy must be demo or default, got %q", errUsage, *pol)
	}
	o := Options{
		Scenario:    sc,
		LagBound:    *lagBound,
		KafkaAddr:   *kafkaAddr,
		NATSURL:     *natsURL,
		MetricsAddr: *metricsAddr,
		ConsoleAddr: *consoleAddr,
		Traces:      *traces,
		JSON:        *asJSON,
		Check:       *check,
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "shared" {
			o.Modes = []Mode{Baseline, PerTenant}
			if *shared {
				o.Modes = Modes
			}
		}
	})
	if *heapBudget != "" {
		n, err := parseSize(*heapBudget)
		if err != nil {
			return Options{}, fmt.Errorf("%w: --heap-budget: %v", errUsage, err)
		}
		o.HeapBudget = n
	}
	switch b := strings.ToLower(*broker); b {
	case "both":
		o.Brokers = []string{"kafka", "nats"}
	case "kafka", "nats", "memory":
		o.Brokers = []string{b}
	default:
		return Options{}, fmt.Errorf("%w: --broker must be kafka, nats or both, got %q", errUsage, *broker)
	}
	if *verbose {
		o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return o, nil
}

// parseSize reads a byte count: digits with an optional KiB, MiB or GiB
// (or K, M, G) suffix.
func parseSize(s string) (uint64, error) {
	units := []struct {
		suffix string
		mult   uint64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}
	mult := uint64(1)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = rest, u.mult
			break
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil || n == 0 || n > (1<<50)/mult {
		return 0, fmt.Errorf("%q is not a size such as 64MiB", s)
	}
	return n * mult, nil
}

// Run runs the demo on each broker of o in turn and returns the results.
func Run(ctx context.Context, o Options) ([]*BrokerResult, error) {
	sc := o.Scenario.withDefaults()
	if err := sc.validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	for _, name := range o.Brokers {
		if factories[name] == nil {
			return nil, fmt.Errorf("%w: broker %q is not available in this build", errUsage, name)
		}
	}

	var register func(*consumer.Consumer, string, Mode) func()
	if o.MetricsAddr != "" {
		srv, reg, err := serveMetrics(o.MetricsAddr, logger)
		if err != nil {
			return nil, err
		}
		defer srv.Close()
		register = reg
		fmt.Fprintf(o.Progress, "metrics: http://%s/metrics\n", srv.Addr)
	}

	var con *console.Console
	if o.ConsoleAddr != "" {
		cctx, stopConsole := context.WithCancel(ctx)
		defer stopConsole()
		var err error
		if con, err = console.New(console.Options{ReadOnly: true, Logger: logger, Title: "ringfence demo"}); err != nil {
			return nil, err
		}
		u, err := con.Start(cctx, o.ConsoleAddr)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(o.Progress, "console: %s\n", u)
	}

	modes := o.Modes
	if modes == nil {
		modes = defaultModes(sc.Kind)
	}
	if !slices.Contains(modes, Baseline) {
		modes = append([]Mode{Baseline}, modes...)
	}
	lagBound := o.LagBound
	if lagBound == 0 {
		lagBound = LongOutageMaxLag
	}
	// One plan without the fault and one with it: they differ only where
	// the fault is traffic (hot's burst, the poison bursts).
	base := newPlan(sc, false)
	faulty := base
	if sc.Kind.inPlan() {
		faulty = newPlan(sc, true)
	}
	v := newView(o.Progress, o.TTY)
	var out []*BrokerResult
	var failed []string
	for _, name := range o.Brokers {
		addr := o.KafkaAddr
		if name == "nats" {
			addr = o.NATSURL
		}
		began := time.Now()
		b, err := factories[name](ctx, addr, logger)
		if err != nil {
			return out, fmt.Errorf("start %s: %w", name, err)
		}
		g := newGroups(base, func(t string) (int, bool) { return b.PartitionOf(t, sc.Partitions) })
		res := &BrokerResult{
			Broker: name, Where: b.Where(), Tenants: base.tenants, Bad: base.tenants[base.bad],
			Sent: base.poisonCount(), BurstSent: faulty.burstCount(), Sc: sc, Keyed: g.keyed, Partitions: g.part, BadPartition: g.badPart,
			Mates: g.mateNames(base), LagBound: lagBound, HeapBudget: o.HeapBudget,
		}
		if res.LagBound == 0 {
			res.LagBound = lagBoundFor(base, g)
		}
		if base.poison >= 0 {
			res.Poison = base.tenants[base.poison]
		}
		for _, m := range modes {
			rc := runConfig{broker: b, logger: logger, observe: v.Observe}
			if register != nil {
				rc.consumer = func(c *consumer.Consumer, m Mode) func() { return register(c, name, m) }
			}
			if con != nil {
				rc.consumer, rc.onEvent = consoleHook(con, name, rc.consumer), con.OnEvent
			}
			p := faulty
			if m == Baseline {
				p = base
			}
			var rec *traceRecorder
			if o.Traces > 0 && m == PerTenant {
				rec = newTraceRecorder(res.Bad)
				rc.tracing = rec.tracing()
			}
			r, err := runMode(ctx, p, g, m, rc)
			if rec != nil {
				rec.print(o.Stdout, name, o.Traces)
			}
			v.Done()
			if err != nil {
				b.Close()
				return out, err
			}
			res.Runs[m] = r
			if !o.TTY {
				fmt.Fprintf(o.Progress, "%-6s %-9s done in %.1fs: healthy goodput in window %d (mates %d), p99 %s (mates %s), max lag %d, %s parked %d, dead-lettered %d, unfinished %d/%d, lost %d, rescues %d\n",
					name, m, r.Elapsed.Seconds(), r.HealthyGoodput, r.MatesGoodput, fmtLatency(r.HealthyP99), fmtLatency(r.MatesP99),
					r.MaxLagRun, res.Bad, r.BadParked, r.BadDead, r.UnfinishedAtDeadline, r.UnfinishedAfterDrain, r.Lost, r.Rescues)
			}
		}
		if err := b.Close(); err != nil {
			logger.Warn("demo: closing broker", "broker", name, "err", err)
		}
		res.Elapsed = time.Since(began)
		out = append(out, res)
		if o.JSON {
			enc := json.NewEncoder(o.Stdout)
			if err := enc.Encode(res.JSON()); err != nil {
				return out, err
			}
		} else {
			res.WriteSummary(o.Stdout)
			fmt.Fprintln(o.Stdout)
			fmt.Fprintln(o.Stdout, res.Verdict())
		}
		if !res.asExpected() {
			failed = append(failed, name)
		}
	}
	if o.Check && len(failed) > 0 {
		return out, fmt.Errorf("%w: %s", errCheck, strings.Join(failed, ", "))
	}
	return out, nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// consoleHook shows each run's consumer on the console, then calls next.
func consoleHook(con *console.Console, broker string, next func(*consumer.Consumer, Mode) func()) func(*consumer.Consumer, Mode) func() {
	return func(c *consumer.Consumer, m Mode) func() {
		con.SetEngine(c, broker+", "+m.String())
		if next != nil {
			return next(c, m)
		}
		return func() {}
	}
}

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
	"strings"
	"time"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/consumer"
)

// Options are the demo's settings, filled from flags by Main.
type Options struct {
	// Brokers lists the brokers to run on, in order: "kafka", "nats",
	// "memory".
	Brokers []string
	// Scenario is the traffic and faults.
	Scenario Scenario
	// KafkaAddr is a real Kafka's host:port; empty starts kfake in-process.
	KafkaAddr string
	// NATSURL is a real NATS server's URL; empty starts one in-process.
	NATSURL string
	// MetricsAddr, if set, serves Prometheus metrics of the running
	// consumer at http://MetricsAddr/metrics.
	MetricsAddr string
	// ConsoleAddr, if set, serves the ops console's tenant view of the
	// running consumer at http://ConsoleAddr/ while the demo runs.
	ConsoleAddr string
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
	tenants := fs.Int("tenants", 20, "number of tenants sending traffic (at least 3)")
	rate := fs.Int("rate", 25, "messages per second per tenant")
	duration := fs.Duration("duration", 8*time.Second, "traffic time of each of the three runs per broker")
	kafkaAddr := fs.String("kafka", "", "HOST:PORT of a real Kafka broker (default: start kfake in-process)")
	natsURL := fs.String("nats", "", "URL of a real NATS server with JetStream (default: start one in-process)")
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics at ADDR/metrics while the demo runs (e.g. 127.0.0.1:9464)")
	consoleAddr := fs.String("console", "", "serve the ops console at ADDR while the demo runs, to watch a tenant park and recover live (e.g. 127.0.0.1:8089)")
	asJSON := fs.Bool("json", false, "print one JSON object per broker instead of tables")
	check := fs.Bool("check", false, "exit 1 unless per-tenant guards kept >= 95% of healthy goodput, dead-lettered nothing of the outage and lost nothing")
	verbose := fs.Bool("v", false, "log the library's warnings (slog) to stderr")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: ringfence demo [flags]

Runs the noisy-neighbour demo: in-process Kafka and NATS, traffic for many
tenants, one tenant's dependency down for a while, another sending poison
messages; the same traffic with no outage, with per-tenant guards, and with
one shared breaker. Prints a live view, then a summary side by side.

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
	o := Options{
		Scenario:    Scenario{Tenants: *tenants, Rate: *rate, Duration: *duration},
		KafkaAddr:   *kafkaAddr,
		NATSURL:     *natsURL,
		MetricsAddr: *metricsAddr,
		ConsoleAddr: *consoleAddr,
		JSON:        *asJSON,
		Check:       *check,
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

	p := newPlan(sc)
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
		res := &BrokerResult{Broker: name, Tenants: p.tenants, Outage: p.tenants[p.outage], Poison: p.tenants[p.poison], Sent: p.poisonCount(), Sc: sc}
		for _, m := range Modes {
			rc := runConfig{broker: b, logger: logger, observe: v.Observe}
			if register != nil {
				rc.consumer = func(c *consumer.Consumer, m Mode) func() { return register(c, name, m) }
			}
			if con != nil {
				rc.consumer, rc.onEvent = consoleHook(con, name, rc.consumer), con.OnEvent
			}
			r, err := runMode(ctx, p, m, rc)
			v.Done()
			if err != nil {
				b.Close()
				return out, err
			}
			res.Runs[m] = r
			if !o.TTY {
				fmt.Fprintf(o.Progress, "%-6s %-9s done in %.1fs: healthy goodput in window %d, outage dead-lettered %d, poison dead-lettered %d, lost %d\n",
					name, m, r.Elapsed.Seconds(), r.HealthyInWindow, r.OutageDead, r.PoisonDead, r.Lost)
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

func (b *BrokerResult) asExpected() bool {
	pt := b.Runs[PerTenant]
	return b.Ratio(PerTenant) >= 0.95 && pt.OutageDead == 0 && pt.Lost == 0
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

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/fleet"
)

const consoleUsage = `Usage:
  ringfence console (--kafka HOST:PORT --topic SOURCE | --nats URL --stream DLQSTREAM) [--group GROUP] [flags]

Serves the ops console's DLQ browser (and its JSON API) for the dead
letters of one Kafka source topic or one JetStream DLQ stream, until
interrupted. It listens on 127.0.0.1:8089 by default.

Reading needs nothing. Replay and purge need the console's token: the
command prints a URL carrying it (open it once: it sets a session cookie),
or give your own with --token or RINGFENCE_CONSOLE_TOKEN; scripts send
Authorization: Bearer TOKEN. --read-only turns replay and purge off.

--group adds the fleet page: the group's processes, partition owners and
tenants not healthy, with hold, release, quarantine and breaker buttons
(see 'ringfence status' and 'ringfence tenant').
`

// consoleFlags are the flags of `ringfence console`.
type consoleFlags struct {
	dlqFlags
	addr       string
	token      string
	readOnly   bool
	maxReplay  int
	replayRate float64
	group      string
}

func newConsoleFlags(stderr io.Writer) *consoleFlags {
	f := &consoleFlags{}
	f.fs = flag.NewFlagSet("ringfence console", flag.ContinueOnError)
	fs := f.fs
	fs.SetOutput(stderr)
	fs.StringVar(&f.kafka, "kafka", "", "Kafka bootstrap broker `HOST:PORT`")
	fs.StringVar(&f.topic, "topic", "", "Kafka source `TOPIC` whose DLQ topics (<topic>.dlq.<token>) to browse")
	fs.StringVar(&f.nats, "nats", "", "NATS server `URL`")
	fs.StringVar(&f.stream, "stream", "", "JetStream DLQ `STREAM` name")
	fs.StringVar(&f.prefix, "subject-prefix", "", "DLQ subject prefix (NATS); default: the stream's own")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "bound of connecting to the broker, and of each DLQ call")
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8089", "listen on `HOST:PORT` (port 0: any free port)")
	fs.StringVar(&f.token, "token", "", "the token that authorizes replay and purge (default: $RINGFENCE_CONSOLE_TOKEN, else a random one, printed)")
	fs.BoolVar(&f.readOnly, "read-only", false, "hide and refuse replay and purge")
	fs.IntVar(&f.maxReplay, "max-replay", 100, "most dead letters one replay moves")
	fs.StringVar(&f.group, "group", "", "also show the fleet of consumer `GROUP` (its agents' status and control tables)")
	fs.Float64Var(&f.replayRate, "replay-rate", 10, "dead letters per second replays may move on average")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\nFlags:\n", consoleUsage)
		fs.PrintDefaults()
	}
	return f
}

func (f *consoleFlags) parse(args []string) error {
	if err := f.dlqFlags.parse(args); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(f.addr); err != nil {
		return usagef("--addr %q: want HOST:PORT", f.addr)
	}
	if f.token == "" {
		f.token = os.Getenv("RINGFENCE_CONSOLE_TOKEN")
	}
	if f.maxReplay < 1 || f.replayRate <= 0 {
		return usagef("--max-replay and --replay-rate must be positive")
	}
	return nil
}

// runConsoleMain runs `ringfence console` until SIGINT or SIGTERM.
func runConsoleMain(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runConsole(ctx, args, stdout, stderr)
}

// runConsole runs `ringfence console` until ctx ends. Its first line on
// stdout is the URL to open.
func runConsole(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "help" || args[0] == "-h" || args[0] == "--help") {
		fmt.Fprint(stdout, consoleUsage)
		return 0
	}
	f := newConsoleFlags(stderr)
	if err := f.parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "ringfence console: %s\n", ue.msg)
		}
		return 2
	}
	octx, cancel := context.WithTimeout(ctx, f.timeout)
	insp, closeFn, err := openInspector(octx, &f.dlqFlags)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "ringfence console: %s\n", oneLine(err))
		return 1
	}
	defer closeFn()
	var fl fleet.Store
	if f.group != "" {
		octx, cancel := context.WithTimeout(ctx, f.timeout)
		st, closeFleet, err := openFleet(octx, &fleetFlags{kafka: f.kafka, nats: f.nats, group: f.group}, false)
		cancel()
		if err != nil {
			fmt.Fprintf(stderr, "ringfence console: %s\n", oneLine(err))
			return 1
		}
		defer closeFleet()
		fl = st
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	con, err := console.New(console.Options{
		DLQ: insp, Fleet: fl, Token: f.token, ReadOnly: f.readOnly, Timeout: f.timeout,
		MaxReplay: f.maxReplay, ReplayRate: f.replayRate, Logger: log,
		Title: "ringfence console · " + f.source(),
	})
	if err != nil {
		fmt.Fprintf(stderr, "ringfence console: %v\n", err)
		return 2
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		fmt.Fprintf(stderr, "ringfence console: %v\n", err)
		return 1
	}
	url := "http://" + ln.Addr().String() + "/"
	switch {
	case f.readOnly:
		fmt.Fprintf(stdout, "ringfence console: %s (read-only)\n", url)
	case f.token == "":
		fmt.Fprintf(stdout, "ringfence console: %s?token=%s\n", url, con.Token())
	default:
		fmt.Fprintf(stdout, "ringfence console: %s (open it with ?token=<your token> to replay and purge)\n", url)
	}
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		fmt.Fprintf(stderr, "ringfence console: warning: listening on %s, not loopback: anyone who reaches it can read the dead letters\n", ln.Addr())
	}
	if err := con.Serve(ctx, ln); err != nil {
		fmt.Fprintf(stderr, "ringfence console: %v\n", err)
		return 1
	}
	return 0
}

// source describes the DLQ the flags name.
func (f *consoleFlags) source() string {
	if f.kafka != "" {
		return "kafka " + f.kafka + " topic " + f.topic
	}
	return "nats " + f.nats + " stream " + f.stream
}

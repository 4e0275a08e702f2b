package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/fleet"
)

const statusUsage = `Usage:
  ringfence status (--kafka HOST:PORT | --nats URL) --group GROUP [--json]

Shows the live processes of a consumer group (those running a fleet.Agent),
who owns which partition, each tenant not healthy and what every process
reports of it, and the active tenant controls. A process that stops
heartbeating leaves the list once its TTL has passed.

--json prints JSON Lines, "type" first: "process", "partition", "tenant",
"control".
`

const tenantUsage = `Usage:
  ringfence tenant VERB [N] (TENANT | --tenant-token TOKEN) --reason TEXT [--by NAME]
                   (--kafka HOST:PORT | --nats URL) --group GROUP

VERB is one of:
  hold | release              stop trying the tenant (messages wait in order) / resume
  quarantine | unquarantine   send its messages to its spill log untried / stop
  open | close | auto         force its breaker open or closed / let it decide
  weight N | concurrency N    override its fair-share weight / bulkhead limit (0: clear)

The control is durable: it is written to the group's control table (Kafka
topic <group>.ringfence-control, NATS KV bucket ringfence-control-<group>)
and every process of the group applies it within a second, and before its
first message when it starts. Each verb changes only its own part of the
tenant's control; who, when and why are kept with it.

TENANT is the raw key; --tenant-token takes its dlq token instead (as
'dlq ls' and 'status' show it).
`

// fleetFlags are the flags of status and tenant.
type fleetFlags struct {
	fs          *flag.FlagSet
	kafka, nats string
	group       string
	json        bool
	timeout     time.Duration
	reason, by  string
	token       string
}

func newFleetFlags(name string, stderr io.Writer, tenant bool) *fleetFlags {
	f := &fleetFlags{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	fs := f.fs
	fs.SetOutput(stderr)
	fs.StringVar(&f.kafka, "kafka", "", "Kafka bootstrap broker `HOST:PORT`")
	fs.StringVar(&f.nats, "nats", "", "NATS server `URL`")
	fs.StringVar(&f.group, "group", "", "the consumer `GROUP` (as its agents were given)")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "give up after this long")
	if tenant {
		fs.StringVar(&f.reason, "reason", "", "why (required; kept with the control)")
		fs.StringVar(&f.by, "by", defaultBy(), "who")
		fs.StringVar(&f.token, "tenant-token", "", "tenant `TOKEN` instead of TENANT")
	} else {
		fs.BoolVar(&f.json, "json", false, "print JSON Lines for scripts")
	}
	return f
}

func defaultBy() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		name += "@" + h
	}
	return name
}

// parse parses flags and positional arguments in any order.
func (f *fleetFlags) parse(args []string) (pos []string, err error) {
	for {
		if err := f.fs.Parse(args); err != nil {
			return nil, err
		}
		if f.fs.NArg() == 0 {
			break
		}
		pos = append(pos, f.fs.Arg(0))
		args = f.fs.Args()[1:]
	}
	switch {
	case (f.kafka == "") == (f.nats == ""):
		return nil, usagef("give --kafka HOST:PORT or --nats URL (one of them)")
	case f.group == "":
		return nil, usagef("--group GROUP is required")
	case f.timeout <= 0:
		return nil, usagef("--timeout must be positive")
	}
	if f.kafka != "" {
		if err := checkHostPort(f.kafka); err != nil {
			return nil, err
		}
		if err := checkTopic(fleet.KafkaTopic(f.group, fleet.KindControl)); err != nil {
			return nil, usagef("--group %q: not usable in a Kafka topic name", f.group)
		}
	} else if _, err := natsAddr(f.nats); err != nil {
		return nil, err
	}
	return pos, nil
}

// openFleet connects to the broker and opens the group's tables (creating
// them when create is set).
func openFleet(ctx context.Context, f *fleetFlags, create bool) (fleet.Store, func(), error) {
	if f.kafka != "" {
		if err := kafkaHandshake(ctx, f.kafka); err != nil {
			return nil, nil, err
		}
		st, err := fleet.NewKafkaStore(ctx, []string{f.kafka}, f.group, fleet.KafkaOptions{Create: create})
		if err != nil {
			return nil, nil, err
		}
		return st, func() { st.Close() }, nil
	}
	addr, _ := natsAddr(f.nats)
	if err := reachable(ctx, addr); err != nil {
		return nil, nil, fmt.Errorf("nats server %s unreachable: %w", f.nats, err)
	}
	nc, err := nats.Connect(f.nats, nats.Timeout(handshakeTimeout), nats.MaxReconnects(0), nats.Name("ringfence fleet"))
	if err != nil {
		return nil, nil, fmt.Errorf("nats server %s: %w", f.nats, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	st, err := fleet.NewNATSStore(ctx, js, f.group, fleet.NATSOptions{Create: create})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return st, nc.Close, nil
}

// fleetUsageError prints a usage error (exit 2); flag.ErrHelp exits 0.
func fleetUsageError(stderr io.Writer, name string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "%s: %s\n", name, ue.msg)
	}
	return 2
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	const name = "ringfence status"
	f := newFleetFlags(name, stderr, false)
	f.fs.Usage = func() { fmt.Fprintf(stderr, "%s\nFlags:\n", statusUsage); f.fs.PrintDefaults() }
	pos, err := f.parse(args)
	if err == nil && len(pos) > 0 {
		err = usagef("unexpected argument %q", pos[0])
	}
	if err != nil {
		return fleetUsageError(stderr, name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	log := slog.New(slog.NewTextHandler(stderr, nil))
	view, err := func() (fleet.View, error) {
		st, closeFn, err := openFleet(ctx, f, false)
		if err != nil {
			return fleet.View{}, err
		}
		defer closeFn()
		ss, err := fleet.ReadStatuses(ctx, st, time.Now(), log)
		if err != nil {
			return fleet.View{}, err
		}
		cs, err := fleet.ReadControls(ctx, st, log)
		if err != nil {
			return fleet.View{}, err
		}
		return fleet.NewView(ss, cs), nil
	}()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err))
		return 1
	}
	if f.json {
		printViewJSON(stdout, view)
	} else {
		printView(stdout, view, time.Now())
	}
	return 0
}

// printViewJSON prints the console's JSON Lines of the fleet.
func printViewJSON(w io.Writer, v fleet.View) {
	enc := json.NewEncoder(w)
	for _, l := range console.FleetLines(v) {
		_ = enc.Encode(l)
	}
}

func printView(w io.Writer, v fleet.View, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "PROCESS\tSOURCE\tPARTITIONS\tTENANTS\tNOT HEALTHY\tCONTROLLED\tHANDLED\tUPDATED\n")
	for _, s := range v.Processes {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s ago\n", printable(s.Process, 60), s.Source, len(s.Partitions), s.Counts.Tenants,
			s.Counts.Unhealthy, s.Counts.Controlled, s.Counts.Handled, now.Sub(s.UpdatedAt).Round(100*time.Millisecond))
	}
	if len(v.Processes) == 0 {
		fmt.Fprintf(tw, "(no live process)\n")
	}
	if len(v.Partitions) > 0 {
		fmt.Fprintf(tw, "\nPARTITION\tOWNERS\n")
		for _, p := range v.Partitions {
			fmt.Fprintf(tw, "%s\t%s\n", p.Partition, strings.Join(p.Owners, ","))
		}
	}
	if len(v.Tenants) > 0 {
		fmt.Fprintf(tw, "\nTENANT\tPROCESS\tSTATE\tRETRY AT\tPARKED\tSPILLING\tLAG\tOLDEST\tHELD\tDLQ DOWN\n")
		for _, t := range v.Tenants {
			for _, o := range t.On {
				retry := "-"
				if !o.RetryAt.IsZero() {
					retry = stamp(o.RetryAt)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%v\t%v\n", tenantLabel(t.Tenant), printable(o.Process, 40), o.State, retry,
					o.Parked, o.Spilling, o.Lag, o.OldestAge.Round(time.Millisecond), o.Held, o.DLQUnavailable)
			}
		}
	}
	if len(v.Controls) > 0 {
		fmt.Fprintf(tw, "\nCONTROLLED TENANT\tTOKEN\tCONTROL\tBY\tAT\tREASON\n")
		for _, c := range v.Controls {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", tenantLabel(c.Tenant), dlq.TenantToken(c.Tenant), c.Control.String(), printable(c.By, 30), stamp(c.At), printable(c.Reason, 60))
		}
	}
	omitted := 0
	for _, s := range v.Processes {
		omitted += s.Counts.Omitted
	}
	if omitted > 0 {
		fmt.Fprintf(tw, "\n(%d more tenants not healthy are counted but not listed by their processes)\n", omitted)
	}
	tw.Flush()
}

// tenantVerbs are the verbs of `ringfence tenant`, with whether they take N.
var tenantVerbs = map[string]bool{
	"hold": false, "release": false, "quarantine": false, "unquarantine": false,
	"open": false, "close": false, "auto": false, "weight": true, "concurrency": true,
}

func runTenant(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, tenantUsage)
		return 2
	}
	verb := args[0]
	switch _, ok := tenantVerbs[verb]; {
	case verb == "-h" || verb == "--help" || verb == "help":
		fmt.Fprint(stdout, tenantUsage)
		return 0
	case !ok:
		fmt.Fprintf(stderr, "ringfence tenant: unknown command %q\n\n%s", verb, tenantUsage)
		return 2
	}
	name := "ringfence tenant " + verb
	f := newFleetFlags(name, stderr, true)
	f.fs.Usage = func() { fmt.Fprintf(stderr, "%s\nFlags:\n", tenantUsage); f.fs.PrintDefaults() }
	pos, err := f.parse(args[1:])
	if err != nil {
		return fleetUsageError(stderr, name, err)
	}
	n := 0
	if tenantVerbs[verb] {
		if len(pos) == 0 {
			return fleetUsageError(stderr, name, usagef("%s needs a number N", verb))
		}
		if n, err = strconv.Atoi(pos[0]); err != nil || n < 0 {
			return fleetUsageError(stderr, name, usagef("%s %q: want a number 0 or more", verb, pos[0]))
		}
		pos = pos[1:]
	}
	tokenSet := flagSet(f.fs, "tenant-token")
	switch {
	case tokenSet && len(pos) > 0:
		return fleetUsageError(stderr, name, usagef("give TENANT or --tenant-token, not both"))
	case !tokenSet && len(pos) == 0:
		return fleetUsageError(stderr, name, usagef("TENANT (or --tenant-token TOKEN) is required"))
	case len(pos) > 1:
		return fleetUsageError(stderr, name, usagef("unexpected argument %q", pos[1]))
	case strings.TrimSpace(f.reason) == "":
		return fleetUsageError(stderr, name, usagef("--reason TEXT is required (it is kept with the control)"))
	case len(f.reason) > 1024 || len(f.by) > 1024:
		return fleetUsageError(stderr, name, usagef("--reason and --by take at most 1024 bytes"))
	}
	var tenant string
	hashed := false
	if tokenSet {
		key, exact, err := dlq.ParseTenantToken(f.token)
		if err != nil {
			return fleetUsageError(stderr, name, usagef("--tenant-token: %v", err))
		}
		tenant, hashed = key, !exact
	} else {
		tenant = pos[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	log := slog.New(slog.NewTextHandler(stderr, nil))
	rec, err := func() (fleet.ControlRecord, error) {
		st, closeFn, err := openFleet(ctx, f, true)
		if err != nil {
			return fleet.ControlRecord{}, err
		}
		defer closeFn()
		cs, err := fleet.ReadControls(ctx, st, log)
		if err != nil {
			return fleet.ControlRecord{}, err
		}
		if hashed {
			if tenant, err = resolveHashed(ctx, st, cs, f.token, log); err != nil {
				return fleet.ControlRecord{}, err
			}
		}
		r := cs[tenant]
		r.Tenant, r.By, r.Reason, r.At = tenant, f.by, f.reason, time.Now().UTC()
		if r.Control, err = r.Control.Apply(verb, n); err != nil {
			return r, err
		}
		return r, fleet.WriteControl(ctx, st, r)
	}()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err))
		return 1
	}
	fmt.Fprintf(stdout, "tenant %s (token %s): %s, by %s: %s\n", tenantLabel(rec.Tenant), dlq.TenantToken(rec.Tenant), rec.Control.String(), rec.By, rec.Reason)
	return 0
}

// resolveHashed finds the raw key of a hashed token among the controlled
// tenants and those the live processes report.
func resolveHashed(ctx context.Context, st fleet.Store, cs map[string]fleet.ControlRecord, token string, log *slog.Logger) (string, error) {
	for t := range cs {
		if dlq.TenantToken(t) == token {
			return t, nil
		}
	}
	ss, err := fleet.ReadStatuses(ctx, st, time.Now(), log)
	if err != nil {
		return "", err
	}
	for _, s := range ss {
		for _, t := range s.Tenants {
			if dlq.TenantToken(t.Tenant) == token {
				return t.Tenant, nil
			}
		}
	}
	return "", fmt.Errorf("hashed token %s names no tenant the fleet knows (controlled or reported); give the raw TENANT", token)
}

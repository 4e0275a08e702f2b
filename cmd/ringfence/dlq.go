package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/ringfence/ringfence/dlq"
)

const dlqUsage = `Usage:
  ringfence dlq ls     (--kafka HOST:PORT --topic SOURCE | --nats URL --stream DLQSTREAM) [--copies] [--json]
  ringfence dlq peek   ... (--tenant KEY | --tenant-token TOKEN) [-n N] [--raw] [--copies] [--json]
  ringfence dlq replay ... (--tenant KEY | --tenant-token TOKEN) [--limit N] [--dry-run] [--json]
  ringfence dlq purge  ... (--tenant KEY | --tenant-token TOKEN) --yes [--json]

Tenants are raw keys, as the producer wrote them; ringfence encodes them
(dots, wildcards, slashes and spaces are fine and touch only that tenant).
--tenant-token takes the TOKEN column of 'ls' instead: it addresses every
tenant, including the no-tenant bucket (_none) and keys a shell cannot
pass (NUL bytes, invalid UTF-8).

A dead letter is counted, shown and replayed once, however many copies of
it the DLQ holds (a message dead-lettered again after a redelivery);
--copies shows them.

--json prints JSON Lines: one object per line, its "type" saying what it
is ("tenant", "record", "replay", "purge", "error"). Raw bytes (keys,
values, header values) are objects {"text": <printable>, "base64": <raw>}.

Exit codes: 0 success, 1 runtime failure (including a stream or topic
that is not a ringfence DLQ), 2 usage error.
`

// Bounds of the CLI.
const (
	// handshakeTimeout bounds connecting to a broker and hearing it answer,
	// apart from --timeout: a port that accepts and never answers fails
	// fast.
	handshakeTimeout = 3 * time.Second
)

// usageError is a command-line mistake: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// dlqFlags are the flags every dlq command shares.
type dlqFlags struct {
	kafka, topic  string
	nats, stream  string
	prefix        string
	tenant, token string
	json          bool
	timeout       time.Duration
	n, limit      int
	raw, dry, yes bool
	copies        bool
	fs            *flag.FlagSet
	wantTenant    bool
}

func newDLQFlags(cmd string, stderr io.Writer) *dlqFlags {
	f := &dlqFlags{fs: flag.NewFlagSet("ringfence dlq "+cmd, flag.ContinueOnError)}
	fs := f.fs
	fs.SetOutput(stderr)
	fs.StringVar(&f.kafka, "kafka", "", "Kafka bootstrap broker `HOST:PORT`")
	fs.StringVar(&f.topic, "topic", "", "Kafka source `TOPIC` whose DLQ topics (<topic>.dlq.<token>) to use")
	fs.StringVar(&f.nats, "nats", "", "NATS server `URL`")
	fs.StringVar(&f.stream, "stream", "", "JetStream DLQ `STREAM` name")
	fs.StringVar(&f.prefix, "subject-prefix", "", "DLQ subject prefix (NATS); default: the stream's own")
	fs.BoolVar(&f.json, "json", false, "print JSON Lines for scripts")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "give up after this long")
	switch cmd {
	case "ls":
		fs.BoolVar(&f.copies, "copies", false, "also show how many records (copies included) each tenant has")
	case "peek":
		f.tenantFlags()
		fs.IntVar(&f.n, "n", 10, "show at most `N` dead letters (0: all)")
		fs.BoolVar(&f.raw, "raw", false, "print whole values, not a preview")
		fs.BoolVar(&f.copies, "copies", false, "list every stored copy of each dead letter")
	case "replay":
		f.tenantFlags()
		fs.IntVar(&f.limit, "limit", 0, "move at most `N` dead letters (0: all)")
		fs.BoolVar(&f.dry, "dry-run", false, "list what would move and change nothing")
	case "purge":
		f.tenantFlags()
		fs.BoolVar(&f.yes, "yes", false, "confirm: remove the tenant's dead letters")
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\nFlags of %s:\n", dlqUsage, fs.Name())
		fs.PrintDefaults()
	}
	return f
}

func (f *dlqFlags) tenantFlags() {
	f.fs.StringVar(&f.tenant, "tenant", "", "tenant `KEY` (raw)")
	f.fs.StringVar(&f.token, "tenant-token", "", "tenant `TOKEN`, as 'ls' shows it (_none: the no-tenant bucket)")
	f.wantTenant = true
}

func (f *dlqFlags) parse(args []string) error {
	if err := f.fs.Parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return usagef("unexpected argument %q", f.fs.Arg(0))
	}
	switch {
	case f.kafka != "" && f.nats != "":
		return usagef("give --kafka or --nats, not both")
	case f.kafka == "" && f.nats == "":
		return usagef("give --kafka HOST:PORT --topic SOURCE, or --nats URL --stream DLQSTREAM")
	case f.kafka != "" && f.topic == "":
		return usagef("--kafka needs --topic SOURCE (the topic whose dead letters to use)")
	case f.nats != "" && f.stream == "":
		return usagef("--nats needs --stream DLQSTREAM")
	case f.n < 0 || f.limit < 0:
		return usagef("-n and --limit must not be negative")
	case f.timeout <= 0:
		return usagef("--timeout must be positive")
	}
	if f.kafka != "" {
		if err := checkHostPort(f.kafka); err != nil {
			return err
		}
		if err := checkTopic(f.topic); err != nil {
			return err
		}
	} else {
		if _, err := natsAddr(f.nats); err != nil {
			return err
		}
		if err := checkStream(f.stream); err != nil {
			return err
		}
		if f.prefix != "" {
			if err := checkPrefix(f.prefix); err != nil {
				return err
			}
		}
	}
	if f.wantTenant {
		tenantSet, tokenSet := flagSet(f.fs, "tenant"), flagSet(f.fs, "tenant-token")
		switch {
		case tenantSet && tokenSet:
			return usagef("give --tenant or --tenant-token, not both")
		case !tenantSet && !tokenSet:
			return usagef("--tenant KEY or --tenant-token TOKEN is required")
		case tokenSet:
			if _, _, err := dlq.ParseTenantToken(f.token); err != nil {
				return usagef("--tenant-token: %v", err)
			}
		}
	}
	return nil
}

// checkHostPort accepts HOST:PORT with a port in 1..65535.
func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return usagef("--kafka %q: want HOST:PORT", s)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return usagef("--kafka %q: port %q is not a number from 1 to 65535", s, port)
	}
	return nil
}

// checkTopic applies Kafka's rule for topic names.
func checkTopic(t string) error {
	if t == "." || t == ".." || len(t) > 249 {
		return usagef("--topic %q: not a Kafka topic name (1 to 249 characters, not . or ..)", t)
	}
	for i := 0; i < len(t); i++ {
		if c := t[i]; !(isAlnum(c) || c == '.' || c == '_' || c == '-') {
			return usagef("--topic %q: not a Kafka topic name (character %q not in [a-zA-Z0-9._-])", t, c)
		}
	}
	return nil
}

// checkStream applies JetStream's rule for stream names.
func checkStream(s string) error {
	if i := strings.IndexAny(s, ".*>/\\ \t\r\n"); i >= 0 {
		return usagef("--stream %q: not a JetStream stream name (contains %q)", s, s[i])
	}
	return nil
}

// checkPrefix accepts a subject of literal tokens.
func checkPrefix(p string) error {
	for tok := range strings.SplitSeq(p, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return usagef("--subject-prefix %q: not a subject of literal tokens", p)
		}
	}
	return nil
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}

func runDLQ(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, dlqUsage)
		return 2
	}
	cmd := args[0]
	switch cmd {
	case "ls", "peek", "replay", "purge":
	case "-h", "--help", "help":
		fmt.Fprint(stdout, dlqUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "ringfence dlq: unknown command %q\n\n%s", cmd, dlqUsage)
		return 2
	}
	f := newDLQFlags(cmd, stderr)
	if err := f.parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "ringfence dlq %s: %s\n", cmd, ue.msg)
		}
		return 2
	}
	if cmd == "purge" && !f.yes {
		fmt.Fprintf(stderr, "ringfence dlq purge: refusing to remove the dead letters of tenant %s without --yes\n", f.tenantArg())
		return 2
	}
	out := newPrinter(stdout, f)
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	err := func() error {
		insp, closeFn, err := openInspector(ctx, f)
		if err != nil {
			return err
		}
		defer closeFn()
		switch cmd {
		case "ls":
			return cmdLs(ctx, insp, out)
		case "peek":
			return cmdPeek(ctx, insp, f, out)
		case "replay":
			return cmdReplay(ctx, insp, f, out)
		default:
			return cmdPurge(ctx, insp, f, out)
		}
	}()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (gave up after --timeout %v)", err, f.timeout)
		}
		out.failed(cmd, err)
		fmt.Fprintf(stderr, "ringfence dlq %s: %s\n", cmd, oneLine(err))
		return 1
	}
	return 0
}

// tenantArg describes the tenant the flags address, for messages.
func (f *dlqFlags) tenantArg() string {
	if flagSet(f.fs, "tenant-token") {
		return "token " + f.token
	}
	return tenantLabel(f.tenant)
}

// resolveTenant returns the raw key the flags address. A hashed token is
// looked up among the tenants listed: ok is false when it has no dead
// letters (so nothing to address).
func resolveTenant(ctx context.Context, insp dlq.Inspector, f *dlqFlags) (tenant string, ok bool, err error) {
	if !flagSet(f.fs, "tenant-token") {
		return f.tenant, true, nil
	}
	key, exact, err := dlq.ParseTenantToken(f.token)
	if err != nil {
		return "", false, err // checked by parse
	}
	if exact {
		return key, true, nil
	}
	ts, err := insp.Tenants(ctx)
	if err != nil {
		return "", false, err
	}
	for _, t := range ts {
		if t.Token == f.token {
			return t.Tenant, true, nil
		}
	}
	return "", false, nil
}

// oneLine keeps an error to one line for stderr.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

func cmdLs(ctx context.Context, insp dlq.Inspector, out *printer) error {
	ts, err := insp.Tenants(ctx)
	if err != nil {
		return err
	}
	out.tenants(ts)
	return nil
}

func cmdPeek(ctx context.Context, insp dlq.Inspector, f *dlqFlags, out *printer) error {
	tenant, ok, err := resolveTenant(ctx, insp, f)
	if err != nil {
		return err
	}
	var recs []dlq.Record
	if ok {
		if recs, err = insp.Peek(ctx, tenant, f.n); err != nil {
			return err
		}
	}
	out.records(recs, f.tenantArg())
	return nil
}

func cmdReplay(ctx context.Context, insp dlq.Inspector, f *dlqFlags, out *printer) error {
	tenant, ok, err := resolveTenant(ctx, insp, f)
	if err != nil {
		return err
	}
	var moved []dlq.Record
	if ok {
		moved, err = insp.Replay(ctx, tenant, dlq.ReplayOptions{Limit: f.limit, DryRun: f.dry})
	}
	out.replayed(tenant, f.tenantArg(), moved, f.dry)
	return err
}

func cmdPurge(ctx context.Context, insp dlq.Inspector, f *dlqFlags, out *printer) error {
	tenant, ok, err := resolveTenant(ctx, insp, f)
	if err != nil {
		return err
	}
	n := 0
	if ok {
		if n, err = insp.Purge(ctx, tenant); err != nil {
			return err
		}
	}
	out.purged(tenant, f.tenantArg(), n)
	return nil
}

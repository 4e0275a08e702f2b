package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/ringfence/ringfence/dlq"
)

const dlqUsage = `Usage:
  ringfence dlq ls     (--kafka HOST:PORT --topic SOURCE | --nats URL --stream DLQSTREAM) [--json]
  ringfence dlq peek   ... --tenant T [-n N] [--raw] [--json]
  ringfence dlq replay ... --tenant T [--limit N] [--dry-run] [--json]
  ringfence dlq purge  ... --tenant T --yes

Tenants are raw keys, as the producer wrote them; ringfence encodes them
(dots, wildcards, slashes and spaces are fine and touch only that tenant).
`

// usageError is a command-line mistake: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// dlqFlags are the flags every dlq command shares.
type dlqFlags struct {
	kafka, topic  string
	nats, stream  string
	prefix        string
	tenant        string
	json          bool
	timeout       time.Duration
	n, limit      int
	raw, dry, yes bool
	fs            *flag.FlagSet
	wantTenant    bool
}

func newDLQFlags(cmd string, stderr io.Writer) *dlqFlags {
	f := &dlqFlags{fs: flag.NewFlagSet("ringfence dlq "+cmd, flag.ContinueOnError)}
	fs := f.fs
	fs.SetOutput(stderr)
	fs.StringVar(&f.kafka, "kafka", "", "Kafka bootstrap broker `HOST:PORT`")
	fs.StringVar(&f.topic, "topic", "", "Kafka source `TOPIC` whose DLQ topics (<topic>.dlq.<tenant>) to use")
	fs.StringVar(&f.nats, "nats", "", "NATS server `URL`")
	fs.StringVar(&f.stream, "stream", "", "JetStream DLQ `STREAM` name")
	fs.StringVar(&f.prefix, "subject-prefix", "", "DLQ subject prefix (NATS); default: the stream's configured prefix")
	fs.BoolVar(&f.json, "json", false, "print JSON for scripts")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "give up after this long")
	switch cmd {
	case "peek":
		fs.StringVar(&f.tenant, "tenant", "", "tenant key (raw)")
		fs.IntVar(&f.n, "n", 10, "show at most `N` records (0: all)")
		fs.BoolVar(&f.raw, "raw", false, "print whole values, not a preview")
		f.wantTenant = true
	case "replay":
		fs.StringVar(&f.tenant, "tenant", "", "tenant key (raw)")
		fs.IntVar(&f.limit, "limit", 0, "move at most `N` records (0: all)")
		fs.BoolVar(&f.dry, "dry-run", false, "list what would move and change nothing")
		f.wantTenant = true
	case "purge":
		fs.StringVar(&f.tenant, "tenant", "", "tenant key (raw)")
		fs.BoolVar(&f.yes, "yes", false, "confirm: remove the tenant's dead letters")
		f.wantTenant = true
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\nFlags of %s:\n", dlqUsage, fs.Name())
		fs.PrintDefaults()
	}
	return f
}

func (f *dlqFlags) parse(args []string) error {
	if err := f.fs.Parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", f.fs.Arg(0))}
	}
	switch {
	case f.kafka != "" && f.nats != "":
		return usageError{"give --kafka or --nats, not both"}
	case f.kafka == "" && f.nats == "":
		return usageError{"give --kafka HOST:PORT --topic SOURCE, or --nats URL --stream DLQSTREAM"}
	case f.kafka != "" && f.topic == "":
		return usageError{"--kafka needs --topic SOURCE (the topic whose dead letters to use)"}
	case f.nats != "" && f.stream == "":
		return usageError{"--nats needs --stream DLQSTREAM"}
	case f.n < 0 || f.limit < 0:
		return usageError{"-n and --limit must not be negative"}
	case f.timeout <= 0:
		return usageError{"--timeout must be positive"}
	}
	if f.wantTenant && !flagSet(f.fs, "tenant") {
		return usageError{"--tenant is required"}
	}
	return nil
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
		fmt.Fprintf(stderr, "ringfence dlq purge: refusing to remove the dead letters of tenant %q without --yes\n", f.tenant)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	insp, closeFn, err := openInspector(ctx, f)
	if err != nil {
		fmt.Fprintf(stderr, "ringfence dlq %s: %s\n", cmd, oneLine(err))
		return 1
	}
	defer closeFn()
	switch cmd {
	case "ls":
		err = cmdLs(ctx, insp, f, stdout)
	case "peek":
		err = cmdPeek(ctx, insp, f, stdout)
	case "replay":
		err = cmdReplay(ctx, insp, f, stdout)
	case "purge":
		err = cmdPurge(ctx, insp, f, stdout)
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (gave up after --timeout %v)", err, f.timeout)
		}
		fmt.Fprintf(stderr, "ringfence dlq %s: %s\n", cmd, oneLine(err))
		return 1
	}
	return 0
}

// oneLine keeps an error to one line for stderr.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// lsRow is the JSON shape of one `ls` row.
type lsRow struct {
	Tenant string    `json:"tenant"`
	Count  int       `json:"count"`
	Oldest time.Time `json:"oldest"`
	Newest time.Time `json:"newest"`
	Reason string    `json:"reason"`
	Error  string    `json:"error"`
}

func cmdLs(ctx context.Context, insp dlq.Inspector, f *dlqFlags, w io.Writer) error {
	ts, err := insp.Tenants(ctx)
	if err != nil {
		return err
	}
	rows := make([]lsRow, 0, len(ts))
	for _, t := range ts {
		rows = append(rows, lsRow{Tenant: t.Tenant, Count: t.Count, Oldest: t.Oldest.UTC(), Newest: t.Newest.UTC(), Reason: string(t.Reason), Error: t.LastError})
	}
	if f.json {
		return json.NewEncoder(w).Encode(rows)
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "no dead letters")
		return nil
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tCOUNT\tOLDEST\tNEWEST\tREASON\tLAST ERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", printable(r.Tenant, 40), r.Count, stamp(r.Oldest), stamp(r.Newest), r.Reason, printable(r.Error, 60))
	}
	return tw.Flush()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

// peekRecord is the JSON shape of one record.
type peekRecord struct {
	Tenant       string            `json:"tenant"`
	Source       string            `json:"source"`
	Partition    *int32            `json:"partition,omitempty"`
	Offset       *int64            `json:"offset,omitempty"`
	Stream       string            `json:"stream,omitempty"`
	Sequence     uint64            `json:"sequence,omitempty"`
	Group        string            `json:"group,omitempty"`
	Attempts     int               `json:"attempts"`
	Reason       string            `json:"reason"`
	Error        string            `json:"error"`
	ErrorType    string            `json:"error_type,omitempty"`
	FirstFailure time.Time         `json:"first_failure"`
	LastFailure  time.Time         `json:"last_failure"`
	Redrive      int               `json:"redrive"`
	Position     int64             `json:"position"`
	Key          string            `json:"key"`
	Value        string            `json:"value"`
	Headers      map[string]string `json:"headers,omitempty"`
}

func cmdPeek(ctx context.Context, insp dlq.Inspector, f *dlqFlags, w io.Writer) error {
	recs, err := insp.Peek(ctx, f.tenant, f.n)
	if err != nil {
		return err
	}
	if f.json {
		enc := json.NewEncoder(w)
		for _, r := range recs {
			if err := enc.Encode(toPeek(r, f.raw)); err != nil {
				return err
			}
		}
		return nil
	}
	if len(recs) == 0 {
		fmt.Fprintf(w, "no dead letters for tenant %q\n", f.tenant)
		return nil
	}
	for i, r := range recs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		writeRecord(w, r, f.raw)
	}
	return nil
}

func toPeek(r dlq.Record, raw bool) peekRecord {
	p := peekRecord{
		Tenant: r.Tenant, Source: r.Source, Stream: r.Stream, Sequence: r.Sequence, Group: r.Group,
		Attempts: r.Attempts, Reason: string(r.Reason), Error: r.Error, ErrorType: r.ErrorType,
		FirstFailure: r.FirstFailure.UTC(), LastFailure: r.LastFailure.UTC(), Redrive: r.Redrive, Position: r.Position,
		Key: string(r.Key), Value: preview(r.Value, raw),
	}
	if r.Stream == "" {
		p.Partition, p.Offset = &r.Partition, &r.Offset
	}
	if len(r.Headers) > 0 {
		p.Headers = make(map[string]string, len(r.Headers))
		for _, h := range r.Headers {
			p.Headers[h.Key] = string(h.Value)
		}
	}
	return p
}

func writeRecord(w io.Writer, r dlq.Record, raw bool) {
	tw := tabwriter.NewWriter(w, 2, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "tenant:\t%s\n", printable(r.Tenant, 0))
	if r.Stream != "" {
		fmt.Fprintf(tw, "source:\t%s (stream %s, sequence %d)\n", r.Source, r.Stream, r.Sequence)
	} else {
		fmt.Fprintf(tw, "source:\t%s (partition %d, offset %d)\n", r.Source, r.Partition, r.Offset)
	}
	if r.Group != "" {
		fmt.Fprintf(tw, "group:\t%s\n", r.Group)
	}
	fmt.Fprintf(tw, "reason:\t%s after %d attempt(s)\n", r.Reason, r.Attempts)
	fmt.Fprintf(tw, "error:\t%s\n", printable(r.Error, 0))
	if r.ErrorType != "" {
		fmt.Fprintf(tw, "error type:\t%s\n", r.ErrorType)
	}
	fmt.Fprintf(tw, "failed:\t%s .. %s\n", r.FirstFailure.UTC().Format(time.RFC3339Nano), r.LastFailure.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(tw, "redrive:\t%d\n", r.Redrive)
	if len(r.Key) > 0 {
		fmt.Fprintf(tw, "key:\t%s\n", printable(string(r.Key), 80))
	}
	for _, h := range r.Headers {
		fmt.Fprintf(tw, "header:\t%s=%s\n", h.Key, printable(string(h.Value), 80))
	}
	fmt.Fprintf(tw, "value:\t%s\n", preview(r.Value, raw))
	tw.Flush()
}

// preview renders a value for a terminal: printable text up to 200 bytes,
// or everything with raw; bytes that are not printable UTF-8 are escaped.
func preview(v []byte, raw bool) string {
	limit := 200
	if raw {
		limit = 0
	}
	s := printable(string(v), limit)
	if !raw && len(v) > 200 {
		s += fmt.Sprintf(" (%d bytes; --raw for all)", len(v))
	}
	return s
}

// printable escapes control characters and invalid UTF-8 and cuts s to
// limit runes (0: no limit).
func printable(s string, limit int) string {
	var b strings.Builder
	n := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if limit > 0 && n >= limit {
			b.WriteString("…")
			break
		}
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x20 || r == 0x7f:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
		i += size
		n++
	}
	return b.String()
}

func cmdReplay(ctx context.Context, insp dlq.Inspector, f *dlqFlags, w io.Writer) error {
	moved, err := insp.Replay(ctx, f.tenant, dlq.ReplayOptions{Limit: f.limit, DryRun: f.dry})
	if f.json {
		out := struct {
			Tenant string `json:"tenant"`
			DryRun bool   `json:"dry_run"`
			Moved  int    `json:"moved"`
			Error  string `json:"error,omitempty"`
		}{Tenant: f.tenant, DryRun: f.dry, Moved: len(moved)}
		if err != nil {
			out.Error = err.Error()
		}
		if jerr := json.NewEncoder(w).Encode(out); jerr != nil {
			return jerr
		}
		return err
	}
	if f.dry {
		for _, r := range moved {
			fmt.Fprintf(w, "would replay position %d to %s (reason %s, redrive %d -> %d)\n", r.Position, r.Source, r.Reason, r.Redrive, r.Redrive+1)
		}
		fmt.Fprintf(w, "dry run: %d dead letter(s) of tenant %q would move; nothing changed\n", len(moved), f.tenant)
		return err
	}
	fmt.Fprintf(w, "replayed %d dead letter(s) of tenant %q to their source\n", len(moved), f.tenant)
	return err
}

func cmdPurge(ctx context.Context, insp dlq.Inspector, f *dlqFlags, w io.Writer) error {
	n, err := insp.Purge(ctx, f.tenant)
	if err != nil {
		return err
	}
	if f.json {
		return json.NewEncoder(w).Encode(struct {
			Tenant string `json:"tenant"`
			Purged int    `json:"purged"`
		}{f.tenant, n})
	}
	fmt.Fprintf(w, "purged %d dead letter(s) of tenant %q\n", n, f.tenant)
	return nil
}

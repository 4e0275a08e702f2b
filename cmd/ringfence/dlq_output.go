package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/dlq"
)

// The JSON shape of every dlq command is the console's JSON API (package
// console: JSON Lines, one object per line, "type" first, bytes as
// text+base64, tenants with their token); one definition serves both, and
// a test holds the console's answers to the same bytes.
type (
	jsonBytes  = console.Bytes
	jsonTenant = console.Tenant
	lsLine     = console.TenantLine
	recordLine = console.RecordLine
	replayLine = console.ReplayLine
	purgeLine  = console.PurgeLine
	errorLine  = console.ErrorLine
)

func tenantOf(key string) jsonTenant { return console.TenantOf(key) }

func recordOf(r dlq.Record, raw bool) recordLine { return console.RecordLineOf(r, raw) }

// printer writes a command's output as text or JSON Lines.
type printer struct {
	w      io.Writer
	json   bool
	raw    bool
	copies bool
	enc    *json.Encoder
}

func newPrinter(w io.Writer, f *dlqFlags) *printer {
	p := &printer{w: w, json: f.json, raw: f.raw, copies: f.copies}
	if p.json {
		p.enc = json.NewEncoder(w)
		p.enc.SetEscapeHTML(false)
	}
	return p
}

func (p *printer) line(v any) { _ = p.enc.Encode(v) }

func (p *printer) failed(cmd string, err error) {
	if p.json {
		p.line(errorLine{Type: "error", Command: cmd, Error: err.Error()})
	}
}

// tenantLabel shows a tenant to a person: "(no tenant)" for the bucket,
// else the key made printable.
func tenantLabel(key string) string {
	if key == "" {
		return "(no tenant)"
	}
	return printable(key, 40)
}

func (p *printer) tenants(ts []dlq.TenantSummary) {
	if p.json {
		for _, t := range ts {
			p.line(lsLine{
				Type: "tenant", Tenant: tenantOf(t.Tenant), Count: t.Count, Records: t.Records,
				Oldest: t.Oldest.UTC(), Newest: t.Newest.UTC(), Reason: string(t.Reason), LastError: t.LastError,
			})
		}
		return
	}
	if len(ts) == 0 {
		fmt.Fprintln(p.w, "no dead letters")
		return
	}
	// TOKEN last: it is as long as 180 characters for a hashed key.
	tw := tabwriter.NewWriter(p.w, 2, 4, 2, ' ', 0)
	if p.copies {
		fmt.Fprintln(tw, "TENANT\tCOUNT\tRECORDS\tOLDEST\tNEWEST\tREASON\tLAST ERROR\tTOKEN")
	} else {
		fmt.Fprintln(tw, "TENANT\tCOUNT\tOLDEST\tNEWEST\tREASON\tLAST ERROR\tTOKEN")
	}
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%d\t", tenantLabel(t.Tenant), t.Count)
		if p.copies {
			fmt.Fprintf(tw, "%d\t", t.Records)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", stamp(t.Oldest), stamp(t.Newest), t.Reason, printable(t.LastError, 60), t.Token)
	}
	tw.Flush()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

func (p *printer) records(recs []dlq.Record, who string) {
	if p.json {
		for _, r := range recs {
			p.line(recordOf(r, p.raw))
		}
		return
	}
	if len(recs) == 0 {
		fmt.Fprintf(p.w, "no dead letters for tenant %s\n", who)
		return
	}
	for i, r := range recs {
		if i > 0 {
			fmt.Fprintln(p.w)
		}
		p.writeRecord(r)
	}
}

func (p *printer) writeRecord(r dlq.Record) {
	tw := tabwriter.NewWriter(p.w, 2, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "tenant:\t%s (token %s)\n", tenantLabel(r.Bucket()), dlq.TenantToken(r.Bucket()))
	if r.Bucket() != r.Tenant {
		fmt.Fprintf(tw, "refused key:\t%s\n", printable(r.Tenant, 0))
	}
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
	fmt.Fprintf(tw, "position:\t%d (written %s)\n", r.Position, r.Time.UTC().Format(time.RFC3339))
	if n := len(r.Copies); n > 1 || p.copies {
		fmt.Fprintf(tw, "copies:\t%d\n", n)
		if p.copies {
			for _, c := range r.Copies {
				fmt.Fprintf(tw, "copy:\tposition %d (written %s)\n", c.Position, c.Time.UTC().Format(time.RFC3339Nano))
			}
		}
	}
	if r.Key != nil {
		fmt.Fprintf(tw, "key:\t%s\n", quoted(r.Key, 80))
	}
	for _, h := range r.Headers {
		if h.Value == nil {
			fmt.Fprintf(tw, "header:\t%s (null)\n", printable(h.Key, 0))
		} else {
			fmt.Fprintf(tw, "header:\t%s=%s\n", printable(h.Key, 0), quoted(h.Value, 80))
		}
	}
	fmt.Fprintf(tw, "value:\t%s\n", p.preview(r.Value))
	tw.Flush()
}

// quoted shows bytes as printable text in double quotes, so that an empty
// value is visible.
func quoted(b []byte, limit int) string {
	return `"` + printable(string(b), limit) + `"`
}

// preview renders a value for a terminal: printable text up to 200
// characters, or everything with --raw.
func (p *printer) preview(v []byte) string {
	limit := 200
	if p.raw {
		limit = 0
	}
	s := printable(string(v), limit)
	if !p.raw && utf8.RuneCount(v) > 200 {
		s += fmt.Sprintf(" (%d bytes; --raw for all)", len(v))
	}
	return s
}

func (p *printer) replayed(tenant, who string, moved []dlq.Record, dry bool) {
	if p.json {
		for _, r := range moved {
			p.line(recordOf(r, p.raw))
		}
		p.line(replayLine{Type: "replay", Tenant: tenantOf(tenant), DryRun: dry, Moved: len(moved)})
		return
	}
	if dry {
		for _, r := range moved {
			fmt.Fprintf(p.w, "would replay position %d to %s (reason %s, redrive %d -> %d)\n", r.Position, r.Source, r.Reason, r.Redrive, r.Redrive+1)
		}
		fmt.Fprintf(p.w, "dry run: %d dead letter(s) of tenant %s would move; nothing changed\n", len(moved), who)
		return
	}
	fmt.Fprintf(p.w, "replayed %d dead letter(s) of tenant %s to their source\n", len(moved), who)
}

func (p *printer) purged(tenant, who string, n int) {
	if p.json {
		p.line(purgeLine{Type: "purge", Tenant: tenantOf(tenant), Purged: n})
		return
	}
	fmt.Fprintf(p.w, "purged %d dead letter(s) of tenant %s\n", n, who)
}

func printable(s string, limit int) string { return console.Printable(s, limit) }

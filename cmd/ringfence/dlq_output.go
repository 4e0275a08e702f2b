package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/ringfence/ringfence/dlq"
)

// The JSON shape of every dlq command: JSON Lines, one object per line,
// "type" first. Anything that came from outside as bytes is a jsonBytes
// (null when absent), so nothing is lost and nothing collides; the tenant
// is a jsonTenant, whose token feeds --tenant-token.

// jsonBytes is raw bytes: Text to read (printable, escaped as printable
// does; cut to 200 characters in a record's value unless --raw) and Base64
// for programs (always whole).
type jsonBytes struct {
	Text   string `json:"text"`
	Base64 string `json:"base64"`
}

func bytesOf(b []byte, limit int) *jsonBytes {
	if b == nil {
		return nil
	}
	return &jsonBytes{Text: printable(string(b), limit), Base64: base64.StdEncoding.EncodeToString(b)}
}

// jsonTenant is a tenant: Key and KeyBase64 hold the raw key ("" for the
// no-tenant bucket), Token the handle for --tenant-token.
type jsonTenant struct {
	Key       string `json:"key"`
	KeyBase64 string `json:"key_base64"`
	Token     string `json:"token"`
	NoTenant  bool   `json:"no_tenant"`
}

func tenantOf(key string) jsonTenant {
	return jsonTenant{
		Key:       printable(key, 0),
		KeyBase64: base64.StdEncoding.EncodeToString([]byte(key)),
		Token:     dlq.TenantToken(key),
		NoTenant:  key == "",
	}
}

// lsLine is one tenant of `ls`.
type lsLine struct {
	Type      string     `json:"type"` // "tenant"
	Tenant    jsonTenant `json:"tenant"`
	Count     int        `json:"count"`   // dead letters, copies counted once
	Records   int        `json:"records"` // stored records, copies included
	Oldest    time.Time  `json:"oldest"`
	Newest    time.Time  `json:"newest"`
	Reason    string     `json:"reason"`
	LastError string     `json:"last_error"`
}

// recordLine is one dead letter of `peek` (and of `replay`).
type recordLine struct {
	Type         string       `json:"type"` // "record"
	Tenant       jsonTenant   `json:"tenant"`
	RefusedKey   *jsonBytes   `json:"refused_key"` // the key refused as a tenant (reason invalid-tenant)
	ID           string       `json:"id"`          // "<topic>/<partition>/<offset>", "<stream>#<sequence>", or "" when unknown
	Position     int64        `json:"position"`
	Time         time.Time    `json:"time"`
	Copies       []copyLine   `json:"copies"`
	Source       string       `json:"source"`
	Partition    *int32       `json:"partition"` // Kafka
	Offset       *int64       `json:"offset"`    // Kafka
	Stream       string       `json:"stream"`    // JetStream
	Sequence     uint64       `json:"sequence"`  // JetStream
	Group        string       `json:"group"`
	Attempts     int          `json:"attempts"`
	Reason       string       `json:"reason"`
	Error        string       `json:"error"`
	ErrorType    string       `json:"error_type"`
	FirstFailure time.Time    `json:"first_failure"`
	LastFailure  time.Time    `json:"last_failure"`
	Redrive      int          `json:"redrive"`
	Key          *jsonBytes   `json:"key"`
	Value        *jsonBytes   `json:"value"`
	Headers      []headerLine `json:"headers"`
}

type copyLine struct {
	Position int64     `json:"position"`
	Time     time.Time `json:"time"`
}

type headerLine struct {
	Key   jsonBytes  `json:"key"`
	Value *jsonBytes `json:"value"` // null: a Kafka header with a null value
}

// replayLine closes `replay`, after one recordLine per dead letter.
type replayLine struct {
	Type   string     `json:"type"` // "replay"
	Tenant jsonTenant `json:"tenant"`
	DryRun bool       `json:"dry_run"`
	Moved  int        `json:"moved"`
}

// purgeLine is `purge`'s one line.
type purgeLine struct {
	Type   string     `json:"type"` // "purge"
	Tenant jsonTenant `json:"tenant"`
	Purged int        `json:"purged"` // dead letters, copies counted once
}

// errorLine ends the output of a command that failed.
type errorLine struct {
	Type    string `json:"type"` // "error"
	Command string `json:"command"`
	Error   string `json:"error"`
}

func recordOf(r dlq.Record, raw bool) recordLine {
	limit := 200
	if raw {
		limit = 0
	}
	l := recordLine{
		Type: "record", Tenant: tenantOf(r.Bucket()), Position: r.Position, Time: r.Time.UTC(),
		Source: r.Source, Stream: r.Stream, Sequence: r.Sequence, Group: r.Group, Attempts: r.Attempts,
		Reason: string(r.Reason), Error: r.Error, ErrorType: r.ErrorType,
		FirstFailure: r.FirstFailure.UTC(), LastFailure: r.LastFailure.UTC(), Redrive: r.Redrive,
		Key: bytesOf(r.Key, 0), Value: bytesOf(r.Value, limit), Headers: []headerLine{}, Copies: []copyLine{},
	}
	if l.Value == nil {
		l.Value = bytesOf([]byte{}, 0)
	}
	if r.Bucket() != r.Tenant {
		l.RefusedKey = bytesOf([]byte(r.Tenant), 0)
	}
	if id, ok := r.ID(); ok {
		l.ID = id.String()
	}
	if r.Stream == "" {
		l.Partition, l.Offset = &r.Partition, &r.Offset
	}
	for _, c := range r.Copies {
		l.Copies = append(l.Copies, copyLine{Position: c.Position, Time: c.Time.UTC()})
	}
	for _, h := range r.Headers {
		l.Headers = append(l.Headers, headerLine{Key: *bytesOf([]byte(h.Key), 0), Value: bytesOf(h.Value, 0)})
	}
	return l
}

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

// printable escapes control characters, backslashes, double quotes and
// invalid UTF-8, and cuts s to limit runes (0: no limit), so that two
// different byte strings never print alike.
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
		case r == '\\' || r == '"':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0:
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

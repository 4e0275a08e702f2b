package console

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// The JSON API speaks JSON Lines: one object per line, "type" first. The
// DLQ routes answer with exactly the lines `ringfence dlq ... --json`
// prints (tenant, record, replay, purge, error); a test in cmd/ringfence
// holds the two to the same bytes. Anything that came from outside as
// bytes is a Bytes (null when absent), and a tenant is a Tenant whose Token
// addresses it in URLs.

// Bytes is raw bytes: Text to read (printable, see Printable; a record's
// value is cut to 200 characters unless raw=1) and Base64 for programs
// (always whole).
type Bytes struct {
	Text   string `json:"text"`
	Base64 string `json:"base64"`
}

func bytesOf(b []byte, limit int) *Bytes {
	if b == nil {
		return nil
	}
	return &Bytes{Text: Printable(string(b), limit), Base64: base64.StdEncoding.EncodeToString(b)}
}

// Tenant is a tenant: Key and KeyBase64 hold the raw key ("" for the
// no-tenant bucket), Token its handle in URLs (/dlq/{token}).
type Tenant struct {
	Key       string `json:"key"`
	KeyBase64 string `json:"key_base64"`
	Token     string `json:"token"`
	NoTenant  bool   `json:"no_tenant"`
}

// TenantOf describes a raw tenant key.
func TenantOf(key string) Tenant {
	return Tenant{
		Key:       Printable(key, 0),
		KeyBase64: base64.StdEncoding.EncodeToString([]byte(key)),
		Token:     dlq.TenantToken(key),
		NoTenant:  key == "",
	}
}

// TenantLine is one tenant of GET /dlq (and of `ringfence dlq ls --json`).
type TenantLine struct {
	Type      string    `json:"type"` // "tenant"
	Tenant    Tenant    `json:"tenant"`
	Count     int       `json:"count"`   // dead letters, copies counted once
	Records   int       `json:"records"` // stored records, copies included
	Oldest    time.Time `json:"oldest"`
	Newest    time.Time `json:"newest"`
	Reason    string    `json:"reason"`
	LastError string    `json:"last_error"`
}

// TenantLineOf converts an inspector's summary.
func TenantLineOf(t dlq.TenantSummary) TenantLine {
	return TenantLine{
		Type: "tenant", Tenant: TenantOf(t.Tenant), Count: t.Count, Records: t.Records,
		Oldest: t.Oldest.UTC(), Newest: t.Newest.UTC(), Reason: string(t.Reason), LastError: t.LastError,
	}
}

// RecordLine is one dead letter of GET /dlq/{token} (and of `ringfence dlq
// peek --json`), and of a replay.
type RecordLine struct {
	Type         string       `json:"type"` // "record"
	Tenant       Tenant       `json:"tenant"`
	RefusedKey   *Bytes       `json:"refused_key"` // the key refused as a tenant (reason invalid-tenant)
	ID           string       `json:"id"`          // "<topic>/<partition>/<offset>", "<stream>#<sequence>", or "" when unknown
	Position     int64        `json:"position"`
	Time         time.Time    `json:"time"`
	Copies       []CopyLine   `json:"copies"`
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
	Key          *Bytes       `json:"key"`
	Value        *Bytes       `json:"value"`
	Headers      []HeaderLine `json:"headers"`
}

// CopyLine is one stored copy of a dead letter.
type CopyLine struct {
	Position int64     `json:"position"`
	Time     time.Time `json:"time"`
}

// HeaderLine is one header of a dead letter.
type HeaderLine struct {
	Key   Bytes  `json:"key"`
	Value *Bytes `json:"value"` // null: a Kafka header with a null value
}

// ReplayLine closes a replay, after one RecordLine per dead letter.
type ReplayLine struct {
	Type   string `json:"type"` // "replay"
	Tenant Tenant `json:"tenant"`
	DryRun bool   `json:"dry_run"`
	Moved  int    `json:"moved"`
}

// PurgeLine is a purge's line.
type PurgeLine struct {
	Type   string `json:"type"` // "purge"
	Tenant Tenant `json:"tenant"`
	Purged int    `json:"purged"` // dead letters, copies counted once
}

// ErrorLine ends an answer that failed.
type ErrorLine struct {
	Type    string `json:"type"` // "error"
	Command string `json:"command"`
	Error   string `json:"error"`
}

// ConfirmLine follows a dry run's lines (console only, not the CLI): POST
// the same action again with expect=Expect (and no dry_run) to carry it
// out. The console refuses (409) when the DLQ changed since the dry run.
type ConfirmLine struct {
	Type   string `json:"type"`   // "confirm"
	Action string `json:"action"` // "replay" or "purge"
	Tenant Tenant `json:"tenant"`
	Count  int    `json:"count"` // dead letters it would touch
	Limit  int    `json:"limit"` // replay: the limit to send back
	Expect string `json:"expect"`
}

// RecordLineOf converts a dead letter; raw keeps the whole value in Text
// (Base64 is always whole).
func RecordLineOf(r dlq.Record, raw bool) RecordLine {
	limit := 200
	if raw {
		limit = 0
	}
	l := RecordLine{
		Type: "record", Tenant: TenantOf(r.Bucket()), Position: r.Position, Time: r.Time.UTC(),
		Source: r.Source, Stream: r.Stream, Sequence: r.Sequence, Group: r.Group, Attempts: r.Attempts,
		Reason: string(r.Reason), Error: r.Error, ErrorType: r.ErrorType,
		FirstFailure: r.FirstFailure.UTC(), LastFailure: r.LastFailure.UTC(), Redrive: r.Redrive,
		Key: bytesOf(r.Key, 0), Value: bytesOf(r.Value, limit), Headers: []HeaderLine{}, Copies: []CopyLine{},
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
		l.Copies = append(l.Copies, CopyLine{Position: c.Position, Time: c.Time.UTC()})
	}
	for _, h := range r.Headers {
		l.Headers = append(l.Headers, HeaderLine{Key: *bytesOf([]byte(h.Key), 0), Value: bytesOf(h.Value, 0)})
	}
	return l
}

// StatsLine is GET / as JSON and each "stats" event of GET /live: a
// snapshot of the engine (consumer.Stats), tenants sorted by key.
type StatsLine struct {
	Type string `json:"type"` // "stats"
	// Seq numbers the snapshots the console took; Time is when.
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Engine is false while no engine is attached (the rest is zero).
	Engine bool   `json:"engine"`
	Label  string `json:"label"`

	Handled          uint64 `json:"handled"`
	Failed           uint64 `json:"failed"`
	DeadLettered     uint64 `json:"dead_lettered"`
	Retried          uint64 `json:"retried"`
	Panics           uint64 `json:"panics"`
	Spilled          uint64 `json:"spilled"`
	Refed            uint64 `json:"refed"`
	SpillFailures    uint64 `json:"spill_failures"`
	Duplicates       uint64 `json:"duplicates"`
	Unwritable       uint64 `json:"unwritable"`
	Parked           int    `json:"parked"`
	Queued           int    `json:"queued"`
	InFlight         int    `json:"in_flight"`
	PausedPartitions int    `json:"paused_partitions"`
	SpillingTenants  int    `json:"spilling_tenants"`
	// DLQUnavailableTenants counts the tenants whose DLQ refuses their
	// dead letters now; DLQFailures the failed dead-letter writes.
	DLQUnavailableTenants int             `json:"dlq_unavailable_tenants"`
	DLQFailures           uint64          `json:"dlq_failures"`
	Partitions            []PartitionLine `json:"partitions"`
	Tenants               []TenantStats   `json:"tenants"`
}

// PartitionLine is one partition of a StatsLine.
type PartitionLine struct {
	Topic       string `json:"topic"`
	Partition   int32  `json:"partition"`
	Queued      int    `json:"queued"`
	Unsettled   int    `json:"unsettled"`
	Paused      bool   `json:"paused"`
	PauseReason string `json:"pause_reason"`
	Committed   int64  `json:"committed"`
	Next        int64  `json:"next"`
	CommitLag   int64  `json:"commit_lag"`
	// OldestNS is how long its oldest unsettled message has been in the
	// engine, in nanoseconds; OldestTenant whose it is (null: none).
	OldestNS     int64   `json:"oldest_ns"`
	OldestTenant *Tenant `json:"oldest_tenant"`
	Lanes        int     `json:"lanes"`
}

// TenantStats is one tenant of a StatsLine (consumer.TenantStats).
type TenantStats struct {
	Tenant       Tenant `json:"tenant"`
	State        string `json:"state"` // breaker: closed, half-open, open
	Parked       int    `json:"parked"`
	Queued       int    `json:"queued"`
	InFlight     int    `json:"in_flight"`
	Limit        int    `json:"limit"`
	Spilling     int    `json:"spilling"`
	Handled      uint64 `json:"handled"`
	Failed       uint64 `json:"failed"`
	DeadLettered uint64 `json:"dead_lettered"`
	Retried      uint64 `json:"retried"`
	Spilled      uint64 `json:"spilled"`
	Refed        uint64 `json:"refed"`
	Unwritable   uint64 `json:"unwritable"`
	// DLQUnavailable: its DLQ refuses its dead letters now (the messages
	// behind them wait); DLQFailures counts its failed dead-letter writes.
	DLQUnavailable bool   `json:"dlq_unavailable"`
	DLQFailures    uint64 `json:"dlq_failures"`
	CommitLag      int64  `json:"commit_lag"`
	LatencyNS      int64  `json:"latency_ns"`
	// OpenSince is when its breaker last left closed (null while closed),
	// OpenForNS how long before the snapshot that was.
	OpenSince *time.Time `json:"open_since"`
	OpenForNS int64      `json:"open_for_ns"`
	// TimeLagNS is the age of its oldest unsettled message (since it was
	// produced), OldestParkedNS of its oldest parked one, and
	// SpillBacklogAgeNS of the oldest of its spilled messages not yet
	// re-fed and settled; 0: none.
	TimeLagNS         int64 `json:"time_lag_ns"`
	OldestParkedNS    int64 `json:"oldest_parked_ns"`
	SpillBacklogAgeNS int64 `json:"spill_backlog_age_ns"`
}

func statsLineOf(seq uint64, at time.Time, label string, s *consumer.Stats) StatsLine {
	l := StatsLine{Type: "stats", Seq: seq, Time: at.UTC(), Label: label, Partitions: []PartitionLine{}, Tenants: []TenantStats{}}
	if s == nil {
		return l
	}
	l.Engine = true
	l.Handled, l.Failed, l.DeadLettered, l.Retried, l.Panics = s.Handled, s.Failed, s.DeadLettered, s.Retried, s.Panics
	l.Spilled, l.Refed, l.SpillFailures, l.Duplicates, l.Unwritable = s.Spilled, s.Refed, s.SpillFailures, s.Duplicates, s.Unwritable
	l.Parked, l.Queued, l.InFlight, l.PausedPartitions, l.SpillingTenants = s.Parked, s.Queued, s.InFlight, s.PausedPartitions, s.SpillingTenants
	l.DLQUnavailableTenants, l.DLQFailures = s.DLQUnavailableTenants, s.DLQFailures
	for _, p := range s.Partitions {
		pl := PartitionLine{
			Topic: p.Partition.Topic, Partition: p.Partition.ID, Queued: p.Queued, Unsettled: p.Unsettled,
			Paused: p.Paused, PauseReason: p.PauseReason.String(), Committed: p.Committed, Next: p.Next,
			CommitLag: p.CommitLag, OldestNS: int64(p.Oldest), Lanes: p.Lanes,
		}
		if p.Unsettled > 0 {
			t := TenantOf(p.OldestTenant)
			pl.OldestTenant = &t
		}
		l.Partitions = append(l.Partitions, pl)
	}
	for _, t := range s.Tenants {
		key := t.Tenant
		if t.NoTenant {
			key = ""
		}
		l.Tenants = append(l.Tenants, TenantStats{
			Tenant: TenantOf(key), State: t.State.String(), Parked: t.Parked, Queued: t.Queued,
			InFlight: t.InFlight, Limit: t.Limit, Spilling: t.Spilling, Handled: t.Handled, Failed: t.Failed,
			DeadLettered: t.DeadLettered, Retried: t.Retried, Spilled: t.Spilled, Refed: t.Refed,
			Unwritable: t.Unwritable, DLQUnavailable: t.DLQUnavailable, DLQFailures: t.DLQFailures,
			CommitLag: t.CommitLag, LatencyNS: int64(t.Latency),
		})
		setSince(&l.Tenants[len(l.Tenants)-1], &t, at)
	}
	return l
}

// EventLine is one line of the event log (GET /log, a "log" event of GET
// /live): an engine event, or a run of repeated events of one tenant (see
// the package documentation, # Events) with Count above 1.
type EventLine struct {
	Type string `json:"type"` // "event"
	// Seq numbers the line's last update; Run the seq it was first stored
	// under, which stays as the run grows (a live viewer replaces the line
	// of the same Run).
	Seq uint64 `json:"seq"`
	Run uint64 `json:"run"`
	// Time is its newest event's time (Last); First its first event's.
	Time  time.Time `json:"time"`
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
	// Count is how many events the line stands for; Kinds their kinds in
	// the order first seen (e.g. ["parked","resumed"]).
	Count int      `json:"count"`
	Kinds []string `json:"kinds"`
	// Kind is the newest event's kind (consumer.EventKind's name: parked,
	// resumed, spilling, ...), and the fields below are the newest event's.
	Kind      string  `json:"kind"`
	Tenant    *Tenant `json:"tenant"`
	Topic     string  `json:"topic"`
	Partition int32   `json:"partition"`
	Offset    int64   `json:"offset"`
	DelayNS   int64   `json:"delay_ns"`
	Reason    string  `json:"reason"` // dead-letter reason
	Pause     string  `json:"pause"`  // pause reason
	Spill     string  `json:"spill"`  // spill reason
	Error     string  `json:"error"`
}

func eventLineOf(s *storedEvent) EventLine {
	e := &s.e
	l := EventLine{
		Type: "event", Seq: s.seq, Run: s.run, Time: s.last.UTC(), First: s.first.UTC(), Last: s.last.UTC(),
		Count: s.count, Kind: e.Kind.String(), Topic: e.Partition.Topic,
		Partition: e.Partition.ID, Offset: e.Offset, DelayNS: int64(e.Delay), Reason: string(e.Reason),
		Pause: e.Pause.String(), Spill: spillName(e.Spill),
	}
	for _, k := range s.kinds {
		if k != 0 {
			l.Kinds = append(l.Kinds, k.String())
		}
	}
	if e.Tenant != "" || e.NoTenant {
		t := TenantOf(e.Tenant)
		l.Tenant = &t
	}
	if e.Err != nil {
		l.Error = Printable(e.Err.Error(), 500)
	}
	return l
}

// spillName names a spill reason ("" for none).
func spillName(r consumer.SpillReason) string {
	if r == 0 {
		return ""
	}
	return fmt.Sprint(r)
}

// Printable escapes control characters, backslashes, double quotes and
// invalid UTF-8, and cuts s to limit runes (0: no limit), so that two
// different byte strings never print alike. It is the CLI's rule; HTML
// escaping comes on top, from html/template.
func Printable(s string, limit int) string {
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

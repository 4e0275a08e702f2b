package fleet

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/ringfence/ringfence/consumer"
)

// Record versions and bounds.
const (
	// Version is the version of the records this package writes. A record
	// of another version is refused by the decoders (and skipped by the
	// agent and the CLI, with one log line).
	Version = 1

	// MaxRecordBytes is the largest record the decoders accept and the
	// largest status NewStatus encodes (tenants are left out, worst last,
	// until it fits). It is under the default message limit of Kafka and
	// NATS (1 MiB).
	MaxRecordBytes = 512 << 10

	// DefaultMaxTenants is how many tenants not healthy a status lists by
	// default (the worst first); the others are counted in
	// Counts.Omitted.
	DefaultMaxTenants = 256

	// maxDecodedTenants bounds the tenants a decoded status may list,
	// whatever its publisher's setting.
	maxDecodedTenants = 4096

	// maxTextLen bounds By and Reason in a control record.
	maxTextLen = 1024
)

// ErrBadRecord: a record that does not decode (wrong JSON, version, or
// fields out of range).
var ErrBadRecord = errors.New("fleet: bad record")

// Status is the heartbeat of one process: what it owns and the tenants it
// finds not healthy. A reader drops it once UpdatedAt+TTL is past.
type Status struct {
	V          int           `json:"v"`
	Process    string        `json:"process"`
	Group      string        `json:"group"`
	Source     string        `json:"source,omitempty"` // "kafka", "nats", ...
	UpdatedAt  time.Time     `json:"updated_at"`
	TTL        time.Duration `json:"ttl_ns"`
	Partitions []string      `json:"partitions,omitempty"` // "topic/id"
	Counts     Counts        `json:"counts"`
	// Tenants lists the tenants not healthy, worst first, at most the
	// publisher's MaxTenants; Counts.Omitted says how many more there are.
	Tenants []TenantStatus `json:"tenants,omitempty"`
}

// Counts are a process's totals in a Status.
type Counts struct {
	Tenants      int    `json:"tenants"`   // tracked
	Unhealthy    int    `json:"unhealthy"` // not healthy (listed or omitted)
	Omitted      int    `json:"omitted"`   // not healthy and not listed
	Controlled   int    `json:"controlled"`
	Handled      uint64 `json:"handled"`
	Failed       uint64 `json:"failed"`
	DeadLettered uint64 `json:"dead_lettered"`
	Parked       int    `json:"parked"`
	Queued       int    `json:"queued"`
	InFlight     int    `json:"in_flight"`
}

// TenantStatus is one tenant not healthy in a Status.
type TenantStatus struct {
	Tenant         string        `json:"-"`     // raw key (any bytes)
	State          string        `json:"state"` // breaker: closed, open, half-open
	RetryAt        time.Time     `json:"retry_at,omitzero"`
	Parked         int           `json:"parked,omitempty"`
	Spilling       int           `json:"spilling,omitempty"`
	Lag            int64         `json:"lag,omitempty"`       // commit lag, offsets
	OldestAge      time.Duration `json:"oldest_ns,omitempty"` // produce time of its oldest unsettled message
	Held           bool          `json:"held,omitempty"`      // waiting because of Hold or Quarantine
	DLQUnavailable bool          `json:"dlq_down,omitempty"`  // its DLQ refuses its dead letters now
	Control        *Control      `json:"control,omitempty"`   // its control, if any
}

// Control is the state part of a ControlRecord (consumer.Control in JSON).
type Control struct {
	Hold        bool   `json:"hold,omitempty"`
	Quarantine  bool   `json:"quarantine,omitempty"`
	Breaker     string `json:"breaker,omitempty"` // "", "auto", "open", "closed"
	Weight      int    `json:"weight,omitempty"`
	Concurrency int    `json:"concurrency,omitempty"`
}

// Active reports whether c changes anything (a cleared control does not).
func (c Control) Active() bool {
	return c.Hold || c.Quarantine || (c.Breaker != "" && c.Breaker != "auto") || c.Weight > 0 || c.Concurrency > 0
}

// String is a short form for tables: "hold,quarantine,breaker=open,weight=3".
func (c Control) String() string {
	var b bytes.Buffer
	add := func(s string) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s)
	}
	if c.Hold {
		add("hold")
	}
	if c.Quarantine {
		add("quarantine")
	}
	if c.Breaker != "" && c.Breaker != "auto" {
		add("breaker=" + c.Breaker)
	}
	if c.Weight > 0 {
		add(fmt.Sprintf("weight=%d", c.Weight))
	}
	if c.Concurrency > 0 {
		add(fmt.Sprintf("concurrency=%d", c.Concurrency))
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

// ControlRecord is an operator's standing instruction for one tenant, as
// stored: the tenant's latest record is its control. A release or clear is
// a record too (Control not Active), so who, when and why stay known.
type ControlRecord struct {
	V       int       `json:"v"`
	Tenant  string    `json:"-"`
	Control           // embedded: hold, quarantine, breaker, weight, concurrency
	By      string    `json:"by"`
	At      time.Time `json:"at"`
	Reason  string    `json:"reason"`
}

// Engine returns the record as the engine's consumer.Control.
func (r ControlRecord) Engine() consumer.Control {
	b, _ := consumer.ParseBreakerOverride(r.Breaker) // validated by DecodeControl
	return consumer.Control{
		Hold: r.Hold, Quarantine: r.Quarantine, Breaker: b,
		Weight: r.Weight, Concurrency: r.Concurrency,
		By: r.By, Reason: r.Reason, At: r.At,
	}
}

// tenantJSON carries a raw tenant key: "tenant" when it is valid UTF-8,
// "tenant_b64" otherwise (JSON strings cannot carry arbitrary bytes).
type tenantJSON struct {
	Tenant    *string `json:"tenant,omitempty"`
	TenantB64 string  `json:"tenant_b64,omitempty"`
}

func putTenant(key string) tenantJSON {
	if utf8.ValidString(key) {
		return tenantJSON{Tenant: &key}
	}
	return tenantJSON{TenantB64: base64.StdEncoding.EncodeToString([]byte(key))}
}

func (t tenantJSON) key() (string, error) {
	switch {
	case t.Tenant != nil && t.TenantB64 != "":
		return "", fmt.Errorf("%w: both tenant and tenant_b64", ErrBadRecord)
	case t.Tenant != nil:
		return *t.Tenant, nil
	case t.TenantB64 != "":
		b, err := base64.StdEncoding.DecodeString(t.TenantB64)
		if err != nil {
			return "", fmt.Errorf("%w: tenant_b64: %v", ErrBadRecord, err)
		}
		return string(b), nil
	}
	return "", fmt.Errorf("%w: no tenant", ErrBadRecord)
}

// MarshalJSON writes the tenant as tenant or tenant_b64.
func (t TenantStatus) MarshalJSON() ([]byte, error) {
	type plain TenantStatus
	return json.Marshal(struct {
		tenantJSON
		plain
	}{putTenant(t.Tenant), plain(t)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (t *TenantStatus) UnmarshalJSON(b []byte) error {
	type plain TenantStatus
	var v struct {
		tenantJSON
		plain
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	key, err := v.key()
	if err != nil {
		return err
	}
	*t = TenantStatus(v.plain)
	t.Tenant = key
	return nil
}

// MarshalJSON writes the tenant as tenant or tenant_b64.
func (r ControlRecord) MarshalJSON() ([]byte, error) {
	type plain ControlRecord
	return json.Marshal(struct {
		tenantJSON
		plain
	}{putTenant(r.Tenant), plain(r)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *ControlRecord) UnmarshalJSON(b []byte) error {
	type plain ControlRecord
	var v struct {
		tenantJSON
		plain
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	key, err := v.key()
	if err != nil {
		return err
	}
	*r = ControlRecord(v.plain)
	r.Tenant = key
	return nil
}

// EncodeControl encodes a control record (Version is set).
func EncodeControl(r ControlRecord) ([]byte, error) {
	r.V = Version
	if err := r.check(); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// DecodeControl decodes and checks a control record.
func DecodeControl(b []byte) (ControlRecord, error) {
	var r ControlRecord
	if err := decode(b, &r); err != nil {
		return ControlRecord{}, err
	}
	if err := r.check(); err != nil {
		return ControlRecord{}, err
	}
	return r, nil
}

func (r ControlRecord) check() error {
	switch {
	case r.V != Version:
		return fmt.Errorf("%w: control record version %d, want %d", ErrBadRecord, r.V, Version)
	case r.Weight < 0 || r.Concurrency < 0:
		return fmt.Errorf("%w: negative weight or concurrency", ErrBadRecord)
	case len(r.By) > maxTextLen || len(r.Reason) > maxTextLen:
		return fmt.Errorf("%w: by or reason longer than %d bytes", ErrBadRecord, maxTextLen)
	}
	if _, err := consumer.ParseBreakerOverride(r.Breaker); err != nil {
		return fmt.Errorf("%w: breaker %q", ErrBadRecord, r.Breaker)
	}
	return nil
}

// EncodeStatus encodes a status (Version is set). A status over
// MaxRecordBytes loses tenants from the end of its list (the least bad)
// until it fits; they are added to Counts.Omitted.
func EncodeStatus(s Status) ([]byte, error) {
	s.V = Version
	if err := s.check(); err != nil {
		return nil, err
	}
	for {
		b, err := json.Marshal(s)
		if err != nil {
			return nil, err
		}
		if len(b) <= MaxRecordBytes {
			return b, nil
		}
		if len(s.Tenants) == 0 {
			return nil, fmt.Errorf("%w: status of %d bytes without tenants (over %d)", ErrBadRecord, len(b), MaxRecordBytes)
		}
		drop := max(1, len(s.Tenants)/4)
		s.Tenants = s.Tenants[:len(s.Tenants)-drop]
		s.Counts.Omitted += drop
	}
}

// DecodeStatus decodes and checks a status.
func DecodeStatus(b []byte) (Status, error) {
	var s Status
	if err := decode(b, &s); err != nil {
		return Status{}, err
	}
	if err := s.check(); err != nil {
		return Status{}, err
	}
	return s, nil
}

func (s Status) check() error {
	switch {
	case s.V != Version:
		return fmt.Errorf("%w: status version %d, want %d", ErrBadRecord, s.V, Version)
	case s.Process == "":
		return fmt.Errorf("%w: status without a process", ErrBadRecord)
	case s.TTL <= 0:
		return fmt.Errorf("%w: status TTL %v is not positive", ErrBadRecord, s.TTL)
	case len(s.Tenants) > maxDecodedTenants:
		return fmt.Errorf("%w: status lists %d tenants (at most %d)", ErrBadRecord, len(s.Tenants), maxDecodedTenants)
	}
	return nil
}

func decode(b []byte, v any) error {
	if len(b) > MaxRecordBytes {
		return fmt.Errorf("%w: %d bytes (at most %d)", ErrBadRecord, len(b), MaxRecordBytes)
	}
	if err := json.Unmarshal(b, v); err != nil {
		if errors.Is(err, ErrBadRecord) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	return nil
}

// Expired reports whether the status is past its TTL at now: its process is
// taken for dead.
func (s Status) Expired(now time.Time) bool {
	return s.UpdatedAt.Add(s.TTL).Before(now)
}

// Verbs are the changes an operator makes to a tenant's control, as the
// CLI and the console name them; Apply takes them.
var Verbs = []string{"hold", "release", "quarantine", "unquarantine", "open", "close", "auto", "weight", "concurrency"}

// ErrUnknownVerb: Apply was given a verb not in Verbs.
var ErrUnknownVerb = errors.New("fleet: unknown verb")

// Apply returns c changed by verb ("weight" and "concurrency" take n, 0
// clearing them; the others ignore it). Each verb changes only its own part.
func (c Control) Apply(verb string, n int) (Control, error) {
	switch verb {
	case "hold", "release":
		c.Hold = verb == "hold"
	case "quarantine", "unquarantine":
		c.Quarantine = verb == "quarantine"
	case "open":
		c.Breaker = "open"
	case "close":
		c.Breaker = "closed"
	case "auto":
		c.Breaker = "auto"
	case "weight", "concurrency":
		if n < 0 {
			return c, fmt.Errorf("fleet: %s %d: want 0 or more", verb, n)
		}
		if verb == "weight" {
			c.Weight = n
		} else {
			c.Concurrency = n
		}
	default:
		return c, fmt.Errorf("%w %q (one of %v)", ErrUnknownVerb, verb, Verbs)
	}
	return c, nil
}

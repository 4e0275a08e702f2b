package dlq

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Header names. Every name starts with HeaderPrefix; see the package
// documentation for what each carries and when it is written.
const (
	HeaderPrefix       = "ringfence-"
	HeaderTenant       = "ringfence-tenant"
	HeaderTenantToken  = "ringfence-tenant-token"
	HeaderSource       = "ringfence-source"
	HeaderPartition    = "ringfence-partition"
	HeaderOffset       = "ringfence-offset"
	HeaderStream       = "ringfence-stream"
	HeaderSequence     = "ringfence-sequence"
	HeaderGroup        = "ringfence-group"
	HeaderAttempts     = "ringfence-attempts"
	HeaderFirstFailure = "ringfence-first-failure"
	HeaderLastFailure  = "ringfence-last-failure"
	HeaderError        = "ringfence-error"
	HeaderErrorType    = "ringfence-error-type"
	HeaderReason       = "ringfence-reason"
	HeaderRedrive      = "ringfence-redrive"
	HeaderTraceParent  = "ringfence-traceparent"

	// HeaderMarker marks a marker record: not a dead letter but a note an
	// adapter keeps in a DLQ, such as "this topic is a ringfence DLQ"
	// (MarkerDLQ) or "these dead letters were replayed or purged"
	// (MarkerMoved). Its value is the marker's kind.
	HeaderMarker = "ringfence-marker"
)

// Marker kinds (values of HeaderMarker).
const (
	// MarkerDLQ is written first into a DLQ topic when it is created, so
	// that a topic can be told to be a ringfence DLQ before it holds a dead
	// letter.
	MarkerDLQ = "dlq"
	// MarkerMoved lists the IDs of dead letters that were replayed or
	// purged, so that their remaining copies are not shown again.
	MarkerMoved = "moved"
)

// numHeaders is how many ringfence- headers EncodeHeaders can write.
const numHeaders = 16

// MaxErrorLen caps Record.Error, in bytes. Longer texts are cut on a UTF-8
// boundary.
const MaxErrorLen = 1024

// TimeLayout is how failure times are written: RFC 3339 in UTC with exactly
// nine fractional digits, so that the texts sort like the times.
const TimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// Errors returned by DecodeRecord.
var (
	// ErrNotRecord: the message carries no ringfence- header.
	ErrNotRecord = errors.New("dlq: not a dead-letter record (no ringfence- headers)")
	// ErrMalformedRecord: a ringfence- header has a value that cannot be
	// decoded, or appears twice.
	ErrMalformedRecord = errors.New("dlq: malformed record")
	// ErrMarker: the message is a marker record (HeaderMarker), which
	// belongs in the DLQ but is not a dead letter.
	ErrMarker = errors.New("dlq: marker record, not a dead letter")
)

// MarkerKind returns the value of the HeaderMarker in headers (matched
// ignoring ASCII case), and whether there is one.
func MarkerKind(headers []Header) (kind string, ok bool) {
	for _, h := range headers {
		if strings.EqualFold(h.Key, HeaderMarker) {
			return string(h.Value), true
		}
	}
	return "", false
}

// IsRingfenceHeader reports whether key starts with HeaderPrefix, ignoring
// ASCII case (some transports canonicalise header names).
func IsRingfenceHeader(key string) bool {
	return len(key) >= len(HeaderPrefix) && strings.EqualFold(key[:len(HeaderPrefix)], HeaderPrefix)
}

// CapError returns what a Record keeps of err: its text capped at
// MaxErrorLen bytes, and its Go type as printed by %T (e.g. "*net.OpError";
// for a wrapped error, the outermost wrapper's type). A nil err gives "", "".
func CapError(err error) (text, typ string) {
	if err == nil {
		return "", ""
	}
	return capText(err.Error()), fmt.Sprintf("%T", err)
}

// capText cuts s to at most MaxErrorLen bytes without splitting a UTF-8
// sequence (invalid bytes are cut anywhere).
func capText(s string) string {
	if len(s) <= MaxErrorLen {
		return s
	}
	i := MaxErrorLen
	for j := 0; j < utf8.UTFMax-1 && i > 0 && !utf8.RuneStart(s[i]); j++ {
		i--
	}
	return s[:i]
}

// Bucket returns the tenant key whose DLQ the record belongs in: r.Tenant,
// or "" (the "no tenant" bucket, NoTenantToken) when r.Reason is
// ReasonNoTenant or ReasonInvalidTenant. Name topics and subjects with
// KafkaTopic(r.Source, r.Bucket()) and NATSSubject(prefix, r.Bucket()).
func (r *Record) Bucket() string {
	if r.Reason == ReasonNoTenant || r.Reason == ReasonInvalidTenant {
		return ""
	}
	return r.Tenant
}

// EncodeHeaders returns the headers to write the record with: r.Headers
// without any ringfence- header (an earlier dead-lettering's are replaced,
// never appended), then the record's ringfence- headers. HeaderTenant and
// HeaderTenantToken are always written; every other header is left out when
// its field holds its zero value (Offset: -1), and a failure time outside
// years 0 to 9999 is left out too. Error is capped at MaxErrorLen. The
// result shares no memory with r except the original header values.
func (r *Record) EncodeHeaders() []Header {
	n := 0
	for _, h := range r.Headers {
		if !IsRingfenceHeader(h.Key) {
			n++
		}
	}
	out := make([]Header, 0, n+numHeaders)
	for _, h := range r.Headers {
		if !IsRingfenceHeader(h.Key) {
			out = append(out, h)
		}
	}

	errText := capText(r.Error)
	token := TenantToken(r.Bucket())
	// All values share one buffer: 2 allocations for the whole encoding.
	e := encoder{buf: make([]byte, 0, len(r.Tenant)+len(token)+len(r.Source)+len(r.Stream)+
		len(r.Group)+len(errText)+len(r.ErrorType)+len(r.Reason)+len(r.TraceParent)+6*20+2*len(TimeLayout))}
	e.putString(HeaderTenant, r.Tenant)
	e.putString(HeaderTenantToken, token)
	if r.Source != "" {
		e.putString(HeaderSource, r.Source)
	}
	if r.Offset != -1 || r.Partition != 0 {
		e.putInt(HeaderPartition, int64(r.Partition))
	}
	if r.Offset != -1 {
		e.putInt(HeaderOffset, r.Offset)
	}
	if r.Stream != "" {
		e.putString(HeaderStream, r.Stream)
	}
	if r.Sequence != 0 {
		e.start(HeaderSequence)
		e.buf = strconv.AppendUint(e.buf, r.Sequence, 10)
	}
	if r.Group != "" {
		e.putString(HeaderGroup, r.Group)
	}
	if r.Attempts != 0 {
		e.putInt(HeaderAttempts, int64(r.Attempts))
	}
	e.putTime(HeaderFirstFailure, r.FirstFailure)
	e.putTime(HeaderLastFailure, r.LastFailure)
	if errText != "" {
		e.putString(HeaderError, errText)
	}
	if r.ErrorType != "" {
		e.putString(HeaderErrorType, r.ErrorType)
	}
	if r.Reason != "" {
		e.putString(HeaderReason, string(r.Reason))
	}
	if r.Redrive != 0 {
		e.putInt(HeaderRedrive, int64(r.Redrive))
	}
	if r.TraceParent != "" {
		e.putString(HeaderTraceParent, r.TraceParent)
	}
	for i := 0; i < e.n; i++ {
		start, end := e.starts[i], len(e.buf)
		if i+1 < e.n {
			end = e.starts[i+1]
		}
		out = append(out, Header{Key: e.keys[i], Value: e.buf[start:end:end]})
	}
	return out
}

// encoder appends header values to one buffer and remembers where each
// starts; the headers are cut from it once it stops growing.
type encoder struct {
	buf    []byte
	keys   [numHeaders]string
	starts [numHeaders]int
	n      int
}

func (e *encoder) start(key string) {
	e.keys[e.n], e.starts[e.n] = key, len(e.buf)
	e.n++
}

func (e *encoder) putString(key, v string) {
	e.start(key)
	e.buf = append(e.buf, v...)
}

func (e *encoder) putInt(key string, v int64) {
	e.start(key)
	e.buf = strconv.AppendInt(e.buf, v, 10)
}

func (e *encoder) putTime(key string, t time.Time) {
	if t.IsZero() || !timeInRange(t) {
		return
	}
	e.start(key)
	e.buf = t.UTC().AppendFormat(e.buf, TimeLayout)
}

func timeInRange(t time.Time) bool {
	y := t.UTC().Year()
	return 0 <= y && y <= 9999
}

// ReplayHeaders returns the headers to republish the record to its source
// with: the original headers, without ringfence- ones, plus HeaderRedrive
// set to r.Redrive+1, and HeaderTraceParent when r.TraceParent is set (the
// engine links the replayed message's process span to it). The engine
// reads HeaderRedrive back with RedriveCount when the message fails again.
func (r *Record) ReplayHeaders() []Header {
	out := make([]Header, 0, len(r.Headers)+2)
	for _, h := range r.Headers {
		if !IsRingfenceHeader(h.Key) {
			out = append(out, h)
		}
	}
	if r.TraceParent != "" {
		out = append(out, Header{Key: HeaderTraceParent, Value: []byte(r.TraceParent)})
	}
	return append(out, Header{Key: HeaderRedrive, Value: strconv.AppendInt(nil, int64(r.Redrive)+1, 10)})
}

// RedriveCount returns the value of the last HeaderRedrive in headers: how
// many times the message was replayed from a DLQ. It is 0 when the header is
// absent, malformed or negative: a bad header must not stop the message.
func RedriveCount(headers []Header) int {
	for i := len(headers) - 1; i >= 0; i-- {
		if strings.EqualFold(headers[i].Key, HeaderRedrive) {
			n, err := strconv.Atoi(string(headers[i].Value))
			if err != nil || n < 0 {
				return 0
			}
			return n
		}
	}
	return 0
}

// DecodeRecord rebuilds a Record from a dead letter's key, value and headers,
// as written with EncodeHeaders. Record.Headers gets the headers without
// ringfence- ones, in order. Header names are matched ignoring ASCII case;
// unknown ringfence- headers (from a newer version) are dropped;
// HeaderTenantToken is not read back (Bucket derives it); Error is capped at
// MaxErrorLen as EncodeHeaders would. Times may carry any offset and come
// back in UTC. The record aliases
// key, value and the header values. Time and Position are left for the
// caller. It returns ErrNotRecord when there is no ringfence- header,
// ErrMarker for a marker record, and an error wrapping ErrMalformedRecord
// when a header cannot be decoded or appears twice.
func DecodeRecord(key, value []byte, headers []Header) (Record, error) {
	r := Record{Key: key, Value: value, Offset: -1}
	n, found := 0, false
	for _, h := range headers {
		if IsRingfenceHeader(h.Key) {
			found = true
			if strings.EqualFold(h.Key, HeaderMarker) {
				return Record{}, ErrMarker
			}
		} else {
			n++
		}
	}
	if !found {
		return Record{}, ErrNotRecord
	}
	if n > 0 {
		r.Headers = make([]Header, 0, n)
	}
	var seen [numHeaders]bool
	for _, h := range headers {
		if !IsRingfenceHeader(h.Key) {
			r.Headers = append(r.Headers, h)
			continue
		}
		name := strings.ToLower(h.Key)
		idx := headerIndex(name)
		if idx < 0 {
			continue
		}
		if seen[idx] {
			return Record{}, fmt.Errorf("%w: header %s appears twice", ErrMalformedRecord, name)
		}
		seen[idx] = true
		if err := r.decodeField(name, h.Value); err != nil {
			return Record{}, err
		}
	}
	return r, nil
}

var headerNames = [numHeaders]string{
	HeaderTenant, HeaderTenantToken, HeaderSource, HeaderPartition, HeaderOffset,
	HeaderStream, HeaderSequence, HeaderGroup, HeaderAttempts, HeaderFirstFailure,
	HeaderLastFailure, HeaderError, HeaderErrorType, HeaderReason, HeaderRedrive,
	HeaderTraceParent,
}

func headerIndex(name string) int {
	for i, h := range headerNames {
		if h == name {
			return i
		}
	}
	return -1
}

func (r *Record) decodeField(name string, v []byte) error {
	var err error
	switch name {
	case HeaderTenant:
		r.Tenant = string(v)
	case HeaderSource:
		r.Source = string(v)
	case HeaderStream:
		r.Stream = string(v)
	case HeaderGroup:
		r.Group = string(v)
	case HeaderError:
		r.Error = capText(string(v))
	case HeaderErrorType:
		r.ErrorType = string(v)
	case HeaderReason:
		r.Reason = Reason(v)
	case HeaderTraceParent:
		r.TraceParent = string(v)
	case HeaderPartition:
		var p int64
		p, err = strconv.ParseInt(string(v), 10, 32)
		r.Partition = int32(p)
	case HeaderOffset:
		r.Offset, err = strconv.ParseInt(string(v), 10, 64)
	case HeaderSequence:
		r.Sequence, err = strconv.ParseUint(string(v), 10, 64)
	case HeaderAttempts:
		r.Attempts, err = strconv.Atoi(string(v))
	case HeaderRedrive:
		r.Redrive, err = strconv.Atoi(string(v))
	case HeaderFirstFailure:
		r.FirstFailure, err = parseTime(v)
	case HeaderLastFailure:
		r.LastFailure, err = parseTime(v)
	}
	if err == nil {
		return nil
	}
	var ne *strconv.NumError
	if errors.As(err, &ne) {
		err = ne.Err
	}
	return fmt.Errorf("%w: header %s %s: %v", ErrMalformedRecord, name, quoteCapped(v), err)
}

var errTimeRange = errors.New("time outside years 0 to 9999")

func parseTime(v []byte) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, string(v))
	if err != nil {
		return time.Time{}, errors.New("not an RFC 3339 time")
	}
	t = t.UTC()
	if !timeInRange(t) {
		return time.Time{}, errTimeRange
	}
	return t, nil
}

func quoteCapped(v []byte) string {
	if len(v) > 64 {
		return strconv.Quote(string(v[:64])) + "..."
	}
	return strconv.Quote(string(v))
}

package dlq

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func fullRecord() Record {
	return Record{
		Tenant:       "acme.corp",
		Key:          []byte("k1"),
		Value:        []byte("payload"),
		Headers:      []Header{{Key: "trace-id", Value: []byte("abc")}, {Key: "trace-id", Value: []byte("def")}},
		Source:       "orders",
		Partition:    3,
		Offset:       1234,
		Group:        "billing",
		Attempts:     5,
		FirstFailure: time.Date(2026, 11, 29, 23, 1, 2, 3, time.UTC),
		LastFailure:  time.Date(2026, 11, 29, 23, 1, 9, 500, time.FixedZone("x", 3600)),
		Error:        "boom",
		ErrorType:    "*errors.errorString",
		Reason:       ReasonExhausted,
		Redrive:      2,
		TraceParent:  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
}

// equalRecords compares what the header codec carries.
func equalRecords(t *testing.T, got, want Record) {
	t.Helper()
	if !bytes.Equal(got.Key, want.Key) || !bytes.Equal(got.Value, want.Value) {
		t.Errorf("key/value = %q/%q, want %q/%q", got.Key, got.Value, want.Key, want.Value)
	}
	if !equalHeaders(got.Headers, want.Headers) {
		t.Errorf("headers = %q, want %q", got.Headers, want.Headers)
	}
	if !got.FirstFailure.Equal(want.FirstFailure) || !got.LastFailure.Equal(want.LastFailure) {
		t.Errorf("times = %v, %v; want %v, %v", got.FirstFailure, got.LastFailure, want.FirstFailure, want.LastFailure)
	}
	got.Key, got.Value, got.Headers, want.Key, want.Value, want.Headers = nil, nil, nil, nil, nil, nil
	got.FirstFailure, got.LastFailure, want.FirstFailure, want.LastFailure = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("record =\n%+v, want\n%+v", got, want)
	}
}

func equalHeaders(a, b []Header) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !bytes.Equal(a[i].Value, b[i].Value) {
			return false
		}
	}
	return true
}

func headerValues(hs []Header, key string) []string {
	var out []string
	for _, h := range hs {
		if h.Key == key {
			out = append(out, string(h.Value))
		}
	}
	return out
}

func TestEncodeHeaders(t *testing.T) {
	t.Parallel()
	r := fullRecord()
	hs := r.EncodeHeaders()
	want := []Header{
		{"trace-id", []byte("abc")},
		{"trace-id", []byte("def")},
		{HeaderTenant, []byte("acme.corp")},
		{HeaderTenantToken, []byte("acme_2ecorp")},
		{HeaderSource, []byte("orders")},
		{HeaderPartition, []byte("3")},
		{HeaderOffset, []byte("1234")},
		{HeaderGroup, []byte("billing")},
		{HeaderAttempts, []byte("5")},
		{HeaderFirstFailure, []byte("2026-11-29T23:01:02.000000003Z")},
		{HeaderLastFailure, []byte("2026-11-29T22:01:09.000000500Z")},
		{HeaderError, []byte("boom")},
		{HeaderErrorType, []byte("*errors.errorString")},
		{HeaderReason, []byte("exhausted")},
		{HeaderRedrive, []byte("2")},
		{HeaderTraceParent, []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
	}
	if !equalHeaders(hs, want) {
		t.Fatalf("EncodeHeaders =\n%q\nwant\n%q", hs, want)
	}
	// Values do not overlap: appending to one must not change the next.
	_ = append(hs[2].Value, 'X')
	if string(hs[3].Value) != "acme_2ecorp" {
		t.Fatalf("header values share capacity: %q", hs[3].Value)
	}
}

func TestEncodeHeadersNATSAndNoTenant(t *testing.T) {
	t.Parallel()
	r := Record{
		Tenant: "", Value: []byte("v"), Source: "orders.eu", Offset: -1,
		Stream: "ORDERS", Sequence: 77, Group: "billing", Attempts: 1,
		Reason: ReasonNoTenant,
	}
	hs := r.EncodeHeaders()
	for _, absent := range []string{HeaderPartition, HeaderOffset, HeaderFirstFailure, HeaderError, HeaderRedrive} {
		if v := headerValues(hs, absent); v != nil {
			t.Errorf("%s = %q, want absent", absent, v)
		}
	}
	if v := headerValues(hs, HeaderTenantToken); len(v) != 1 || v[0] != NoTenantToken {
		t.Errorf("tenant token = %q, want %q", v, NoTenantToken)
	}
	// An invalid tenant keeps its key but goes to the no-tenant bucket.
	r = Record{Tenant: "bad\x00key", Offset: -1, Reason: ReasonInvalidTenant}
	hs = r.EncodeHeaders()
	if v := headerValues(hs, HeaderTenant); len(v) != 1 || v[0] != "bad\x00key" {
		t.Errorf("tenant = %q", v)
	}
	if v := headerValues(hs, HeaderTenantToken); len(v) != 1 || v[0] != NoTenantToken {
		t.Errorf("tenant token = %q, want %q", v, NoTenantToken)
	}
}

func TestEncodeHeadersHashedTenantKeepsKey(t *testing.T) {
	t.Parallel()
	key := strings.Repeat("\xfe", 3000)
	r := Record{Tenant: key, Offset: -1, Reason: ReasonPermanent}
	hs := r.EncodeHeaders()
	if v := headerValues(hs, HeaderTenant); len(v) != 1 || v[0] != key {
		t.Fatalf("tenant header does not hold the full key")
	}
	got, err := DecodeRecord(nil, nil, hs)
	if err != nil || got.Tenant != key {
		t.Fatalf("DecodeRecord: tenant %d bytes, err %v", len(got.Tenant), err)
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	cases := map[string]Record{
		"kafka":  fullRecord(),
		"nats":   {Tenant: "t", Source: "orders.eu", Offset: -1, Stream: "ORDERS", Sequence: 1 << 63, Reason: ReasonPoison},
		"zero":   {},
		"offset": {Offset: -1, Partition: 7},
		"extremes": {Tenant: "\xff\x00", Partition: -1 << 31, Offset: -1 << 63, Attempts: -3, Redrive: 1 << 40,
			FirstFailure: time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), LastFailure: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
			Reason: "future-reason"},
	}
	for name, r := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := DecodeRecord(r.Key, r.Value, r.EncodeHeaders())
			if err != nil {
				t.Fatal(err)
			}
			equalRecords(t, got, r)
		})
	}
}

// Re-dead-lettering a replayed message replaces the ringfence- headers: the
// result carries each exactly once, with Redrive raised, and the user's
// headers once, in order.
func TestRedeadLetterReplacesHeaders(t *testing.T) {
	t.Parallel()
	first := fullRecord()
	first.Redrive = 0
	dead := first.EncodeHeaders()

	stored, err := DecodeRecord(first.Key, first.Value, dead)
	if err != nil {
		t.Fatal(err)
	}
	replayed := stored.ReplayHeaders()
	if v := headerValues(replayed, HeaderRedrive); len(v) != 1 || v[0] != "1" {
		t.Fatalf("replay headers redrive = %q", v)
	}
	if n := RedriveCount(replayed); n != 1 {
		t.Fatalf("RedriveCount = %d, want 1", n)
	}

	// The engine sees the replayed message fail again and dead-letters it
	// with the message's headers as they came (ringfence- ones included).
	again := first
	again.Headers = append(replayed, Header{Key: "Ringfence-Error", Value: []byte("stale, canonicalised")})
	again.Redrive = RedriveCount(replayed)
	again.Error = "boom again"
	hs := again.EncodeHeaders()

	counts := map[string]int{}
	for _, h := range hs {
		counts[strings.ToLower(h.Key)]++
	}
	for _, name := range headerNames {
		if counts[name] > 1 {
			t.Errorf("%s appears %d times", name, counts[name])
		}
	}
	if counts["trace-id"] != 2 {
		t.Errorf("trace-id appears %d times, want 2", counts["trace-id"])
	}
	got, err := DecodeRecord(again.Key, again.Value, hs)
	if err != nil {
		t.Fatal(err)
	}
	if got.Redrive != 1 || got.Error != "boom again" {
		t.Fatalf("redrive %d, error %q", got.Redrive, got.Error)
	}
	if !equalHeaders(got.Headers, first.Headers) {
		t.Fatalf("headers = %q, want %q", got.Headers, first.Headers)
	}
}

func TestRedriveCount(t *testing.T) {
	t.Parallel()
	tests := []struct {
		hs   []Header
		want int
	}{
		{nil, 0},
		{[]Header{{HeaderRedrive, []byte("3")}}, 3},
		{[]Header{{"Ringfence-Redrive", []byte("4")}}, 4},
		{[]Header{{HeaderRedrive, []byte("1")}, {HeaderRedrive, []byte("2")}}, 2},
		{[]Header{{HeaderRedrive, []byte("x")}}, 0},
		{[]Header{{HeaderRedrive, []byte("-5")}}, 0},
	}
	for _, tt := range tests {
		if got := RedriveCount(tt.hs); got != tt.want {
			t.Errorf("RedriveCount(%q) = %d, want %d", tt.hs, got, tt.want)
		}
	}
}

func TestDecodeRecordErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		hs      []Header
		want    error
		message string
	}{
		{"no headers", nil, ErrNotRecord, ""},
		{"only user headers", []Header{{"a", []byte("b")}}, ErrNotRecord, ""},
		{"bad offset", []Header{{HeaderOffset, []byte("12x")}}, ErrMalformedRecord, `dlq: malformed record: header ringfence-offset "12x": invalid syntax`},
		{"partition overflow", []Header{{HeaderPartition, []byte("2147483648")}}, ErrMalformedRecord, "value out of range"},
		{"negative sequence", []Header{{HeaderSequence, []byte("-1")}}, ErrMalformedRecord, "ringfence-sequence"},
		{"bad attempts", []Header{{HeaderAttempts, []byte("")}}, ErrMalformedRecord, "ringfence-attempts"},
		{"bad redrive", []Header{{HeaderRedrive, []byte("1e3")}}, ErrMalformedRecord, "ringfence-redrive"},
		{"bad time", []Header{{HeaderFirstFailure, []byte("yesterday")}}, ErrMalformedRecord, "not an RFC 3339 time"},
		{"time out of range", []Header{{HeaderLastFailure, []byte("0000-01-01T00:00:00+01:00")}}, ErrMalformedRecord, "outside years"},
		{"duplicate", []Header{{HeaderTenant, []byte("a")}, {"RINGFENCE-TENANT", []byte("b")}}, ErrMalformedRecord, "appears twice"},
		{"long value quoted capped", []Header{{HeaderOffset, bytes.Repeat([]byte("9"), 5000)}}, ErrMalformedRecord, `"...: value out of range`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := DecodeRecord(nil, nil, tt.hs)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.message) || !strings.HasPrefix(err.Error(), "dlq: ") || len(err.Error()) > 200 {
				t.Fatalf("err = %q, want it to contain %q", err, tt.message)
			}
		})
	}
}

func TestDecodeRecordLenient(t *testing.T) {
	t.Parallel()
	hs := []Header{
		{"x", []byte("1")},
		{"RingFence-Tenant", []byte("acme")},
		{HeaderPrefix + "from-the-future", []byte("?")},
		{HeaderFirstFailure, []byte("2026-11-29T23:00:00+01:00")},
		{HeaderError, []byte(strings.Repeat("e", 2000))},
	}
	got, err := DecodeRecord(nil, nil, hs)
	if err != nil {
		t.Fatal(err)
	}
	if got.Tenant != "acme" || got.Offset != -1 || len(got.Headers) != 1 || len(got.Error) != MaxErrorLen {
		t.Fatalf("got %+v", got)
	}
	if want := time.Date(2026, 11, 29, 22, 0, 0, 0, time.UTC); !got.FirstFailure.Equal(want) || got.FirstFailure.Location() != time.UTC {
		t.Fatalf("first failure %v, want %v in UTC", got.FirstFailure, want)
	}
}

func TestCapError(t *testing.T) {
	t.Parallel()
	if text, typ := CapError(nil); text != "" || typ != "" {
		t.Fatalf("CapError(nil) = %q, %q", text, typ)
	}
	text, typ := CapError(fmt.Errorf("open: %w", fs.ErrNotExist))
	if text != "open: file does not exist" || typ != "*fmt.wrapError" {
		t.Fatalf("CapError = %q, %q", text, typ)
	}
	// 1023 ASCII bytes then a 3-byte rune: cut before the rune.
	long := strings.Repeat("a", MaxErrorLen-1) + "€" + "tail"
	text, _ = CapError(errors.New(long))
	if text != strings.Repeat("a", MaxErrorLen-1) {
		t.Fatalf("cut at %d bytes, valid UTF-8 %v", len(text), utf8.ValidString(text))
	}
	// Invalid UTF-8 made of continuation bytes is cut at most 3 bytes short.
	text, _ = CapError(errors.New(strings.Repeat("\x80", 2*MaxErrorLen)))
	if len(text) < MaxErrorLen-3 || len(text) > MaxErrorLen {
		t.Fatalf("cut at %d bytes", len(text))
	}
}

func TestEncodeHeadersAllocs(t *testing.T) {
	r := fullRecord()
	r.Tenant = "acme-corp"
	if n := testing.AllocsPerRun(100, func() { _ = r.EncodeHeaders() }); n > 2 {
		t.Fatalf("EncodeHeaders: %v allocs, want at most 2", n)
	}
}

// FuzzDecodeRecord decodes arbitrary headers (never panicking, and stable
// under re-encoding when they decode), and round-trips a record built from
// the fuzzed fields whose headers include the arbitrary, possibly
// ringfence-, ones.
func FuzzDecodeRecord(f *testing.F) {
	r := fullRecord()
	f.Add(packHeaders(r.EncodeHeaders()), "acme.corp", "orders", int32(3), int64(1234), "", uint64(0), "g",
		5, int64(1764457262), int64(1764457269), "boom", "*errors.errorString", "exhausted", 2)
	f.Add(packHeaders([]Header{{HeaderOffset, []byte("x")}}), "", "", int32(0), int64(-1), "S", uint64(9), "",
		0, int64(0), int64(0), "", "", "no-tenant", 0)
	f.Add([]byte("ringfence-first-failure\x000000-01-01T00:00:00+01:00\x00a\x00b"), "\xff", "s", int32(-1), int64(0), "",
		uint64(1<<63), "", -1, int64(-62135596800), int64(253402300799), strings.Repeat("é", 600), "t", "", -7)
	f.Fuzz(func(t *testing.T, raw []byte, tenant, source string, partition int32, offset int64, stream string,
		seq uint64, group string, attempts int, first, last int64, errText, errType, reason string, redrive int) {
		hs := unpackHeaders(raw)

		// 1. Arbitrary headers: no panic; a decoded record is stable.
		if got, err := DecodeRecord([]byte("k"), nil, hs); err == nil {
			again, err := DecodeRecord(got.Key, got.Value, got.EncodeHeaders())
			if err != nil {
				t.Fatalf("re-decoding %+v: %v", got, err)
			}
			equalRecords(t, again, got)
		} else if !errors.Is(err, ErrNotRecord) && !errors.Is(err, ErrMalformedRecord) {
			t.Fatalf("unexpected error %v", err)
		}

		// 2. A record from fields, over those headers, round-trips.
		rec := Record{
			Tenant: tenant, Key: raw, Value: []byte(source), Headers: hs, Source: source,
			Partition: partition, Offset: offset, Stream: stream, Sequence: seq, Group: group,
			Attempts: attempts, FirstFailure: fuzzTime(first), LastFailure: fuzzTime(last),
			Error: errText, ErrorType: errType, Reason: Reason(reason), Redrive: redrive,
		}
		got, err := DecodeRecord(rec.Key, rec.Value, rec.EncodeHeaders())
		if err != nil {
			t.Fatalf("decoding %+v: %v", rec, err)
		}
		want := rec
		want.Error = capText(rec.Error)
		want.Headers = nil
		for _, h := range hs {
			if !IsRingfenceHeader(h.Key) {
				want.Headers = append(want.Headers, h)
			}
		}
		equalRecords(t, got, want)
	})
}

// fuzzTime maps any int64 into the representable range, nanoseconds
// included.
func fuzzTime(n int64) time.Time {
	const lo, hi = -62167219200, 253402300799 // years 0 and 9999
	if n == 0 {
		return time.Time{}
	}
	sec := lo + int64(uint64(n)%uint64(hi-lo+1))
	return time.Unix(sec, int64(uint64(n)%1e9))
}

// packHeaders and unpackHeaders map headers to and from NUL-separated
// key, value pairs.
func packHeaders(hs []Header) []byte {
	var b []byte
	for _, h := range hs {
		b = append(b, h.Key...)
		b = append(b, 0)
		b = append(b, h.Value...)
		b = append(b, 0)
	}
	return b
}

func unpackHeaders(b []byte) []Header {
	if len(b) == 0 {
		return nil
	}
	parts := bytes.Split(b, []byte{0})
	var hs []Header
	for i := 0; i+1 < len(parts); i += 2 {
		hs = append(hs, Header{Key: string(parts[i]), Value: parts[i+1]})
	}
	return hs
}

// A replay carries the dead-lettered message's process span on, for the
// replayed message's span to link to; the producer's headers stay as they
// were.
func TestReplayHeadersKeepTraceParent(t *testing.T) {
	t.Parallel()
	r := fullRecord()
	r.Headers = append(r.Headers, Header{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
		Header{Key: HeaderTraceParent, Value: []byte("stale")})
	hs := r.ReplayHeaders()
	if got := headerValues(hs, HeaderTraceParent); len(got) != 1 || got[0] != r.TraceParent {
		t.Errorf("%s = %q, want [%q]", HeaderTraceParent, got, r.TraceParent)
	}
	if got := headerValues(hs, "traceparent"); len(got) != 1 || got[0] != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Errorf("traceparent = %q, want the producer's", got)
	}
	r.TraceParent = ""
	if got := headerValues(r.ReplayHeaders(), HeaderTraceParent); len(got) != 0 {
		t.Errorf("untraced record replays %s = %q", HeaderTraceParent, got)
	}
}

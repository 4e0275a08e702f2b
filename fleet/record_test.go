package fleet_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ringfence/ringfence/fleet"
)

func TestControlRecordRoundTrip(t *testing.T) {
	t.Parallel()
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tenant := range []string{"acme", "", "a.b c/*>", "\xff\x00bytes"} {
		r := fleet.ControlRecord{Tenant: tenant, Control: fleet.Control{Hold: true, Breaker: "open", Weight: 3}, By: "ops", At: at, Reason: "incident"}
		b, err := fleet.EncodeControl(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := fleet.DecodeControl(b)
		if err != nil {
			t.Fatalf("%q: %v (%s)", tenant, err, b)
		}
		r.V = fleet.Version
		if got != r {
			t.Fatalf("round trip of %q: got %+v, want %+v", tenant, got, r)
		}
		if e := got.Engine(); !e.Hold || e.Breaker.String() != "open" || e.Weight != 3 || e.By != "ops" {
			t.Fatalf("Engine() = %+v", e)
		}
	}
}

func TestDecodersRefuseBadRecords(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in string }{
		{"not json", "{"},
		{"version", `{"v":2,"tenant":"a","by":"x","at":"2030-01-01T00:00:00Z","reason":"r"}`},
		{"no tenant", `{"v":1,"by":"x","reason":"r"}`},
		{"both tenants", `{"v":1,"tenant":"a","tenant_b64":"YQ==","reason":"r"}`},
		{"bad base64", `{"v":1,"tenant_b64":"!!","reason":"r"}`},
		{"breaker", `{"v":1,"tenant":"a","breaker":"sideways"}`},
		{"negative weight", `{"v":1,"tenant":"a","weight":-1}`},
	} {
		if _, err := fleet.DecodeControl([]byte(tc.in)); !errors.Is(err, fleet.ErrBadRecord) {
			t.Errorf("%s: DecodeControl error %v, want ErrBadRecord", tc.name, err)
		}
	}
	for _, in := range []string{"[]", `{"v":1}`, `{"v":1,"process":"p","ttl_ns":0}`, `{"v":9,"process":"p","ttl_ns":5}`} {
		if _, err := fleet.DecodeStatus([]byte(in)); !errors.Is(err, fleet.ErrBadRecord) {
			t.Errorf("DecodeStatus(%s) error %v, want ErrBadRecord", in, err)
		}
	}
}

// A status too big for one record loses its least bad tenants, counted as
// omitted.
func TestEncodeStatusBounded(t *testing.T) {
	t.Parallel()
	s := fleet.Status{Process: "p", TTL: time.Second, UpdatedAt: time.Now()}
	for i := range 3000 {
		s.Tenants = append(s.Tenants, fleet.TenantStatus{Tenant: strings.Repeat("x", 300) + string(rune('a'+i%26)), State: "open"})
	}
	s.Counts.Unhealthy = len(s.Tenants)
	b, err := fleet.EncodeStatus(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > fleet.MaxRecordBytes {
		t.Fatalf("%d bytes, over %d", len(b), fleet.MaxRecordBytes)
	}
	got, err := fleet.DecodeStatus(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Tenants)+got.Counts.Omitted != 3000 || got.Counts.Omitted == 0 {
		t.Fatalf("%d listed + %d omitted, want 3000 with some omitted", len(got.Tenants), got.Counts.Omitted)
	}
}

func FuzzDecodeControl(f *testing.F) {
	r := fleet.ControlRecord{Tenant: "t\xff", Control: fleet.Control{Quarantine: true, Concurrency: 2}, By: "b", Reason: "r", At: time.Unix(1, 0).UTC()}
	b, _ := fleet.EncodeControl(r)
	f.Add(b)
	f.Add([]byte(`{"v":1,"tenant":"a","hold":true,"breaker":"closed"}`))
	f.Add([]byte(`{"v":1,"tenant_b64":"AP8=","breaker":"auto"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := fleet.DecodeControl(in)
		if err != nil {
			return
		}
		b, err := fleet.EncodeControl(r)
		if err != nil {
			t.Fatalf("a decoded record does not encode: %v", err)
		}
		r2, err := fleet.DecodeControl(b)
		if err == nil && r2.At.Equal(r.At) {
			r2.At = r.At
		}
		if err != nil || r2 != r {
			t.Fatalf("re-decode: %+v, %v; want %+v", r2, err, r)
		}
	})
}

func FuzzDecodeStatus(f *testing.F) {
	s := fleet.Status{Process: "h/1/ab", Group: "g", TTL: time.Second, UpdatedAt: time.Unix(5, 0).UTC(), Partitions: []string{"t/0"},
		Tenants: []fleet.TenantStatus{{Tenant: "a", State: "open", RetryAt: time.Unix(9, 0).UTC(), Control: &fleet.Control{Hold: true}}, {Tenant: "\x00", State: "closed", Parked: 2}}}
	b, _ := fleet.EncodeStatus(s)
	f.Add(b)
	f.Add([]byte(`{"v":1,"process":"p","ttl_ns":1,"tenants":[{"tenant_b64":"AA==","state":"open"}]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := fleet.DecodeStatus(in)
		if err != nil {
			return
		}
		b, err := fleet.EncodeStatus(s)
		if err != nil {
			t.Fatalf("a decoded status does not encode: %v", err)
		}
		if _, err := fleet.DecodeStatus(b); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

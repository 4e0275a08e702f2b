package dlq

import (
	"errors"
	"testing"
	"time"
)

func TestRecordID(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		r    Record
		want ID
		ok   bool
		str  string
	}{
		{"kafka", Record{Source: "orders", Partition: 2, Offset: 9}, ID{Topic: "orders", Partition: 2, Offset: 9}, true, "orders/2/9"},
		{"kafka offset 0", Record{Source: "orders", Offset: 0}, ID{Topic: "orders"}, true, "orders/0/0"},
		{"jetstream", Record{Source: "orders.eu", Offset: -1, Stream: "ORDERS", Sequence: 7}, ID{Stream: "ORDERS", Sequence: 7}, true, "ORDERS#7"},
		{"no offset", Record{Source: "orders", Offset: -1}, ID{}, false, ""},
		{"no source", Record{Offset: 3}, ID{}, false, ""},
		{"stream without sequence", Record{Stream: "S", Offset: -1}, ID{}, false, ""},
	}
	for _, tc := range cases {
		id, ok := tc.r.ID()
		if id != tc.want || ok != tc.ok || id.String() != tc.str {
			t.Errorf("%s: ID() = %+v, %v (%q); want %+v, %v (%q)", tc.name, id, ok, id.String(), tc.want, tc.ok, tc.str)
		}
	}
}

func TestCollapse(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := func(tenant string, off, pos int64) Record {
		return Record{Tenant: tenant, Source: "orders", Offset: off, Position: pos, Time: t0.Add(time.Duration(pos) * time.Second), Value: []byte{byte(pos)}}
	}
	in := []Record{
		rec("a", 10, 0),
		rec("a", 11, 1),
		rec("a", 10, 2), // copy of position 0
		{Tenant: "a", Source: "orders", Offset: -1, Position: 3, Time: t0.Add(3 * time.Second)},
		{Tenant: "a", Source: "orders", Offset: -1, Position: 4, Time: t0.Add(4 * time.Second)}, // no ID: its own
		rec("b", 10, 5), // same ID, other tenant: not a copy
		rec("a", 10, 6), // third copy
	}
	got := Collapse(in)
	if len(got) != 5 {
		t.Fatalf("Collapse gave %d records, want 5: %+v", len(got), got)
	}
	wantCopies := [][]int64{{0, 2, 6}, {1}, {3}, {4}, {5}}
	for i, r := range got {
		if len(r.Copies) != len(wantCopies[i]) {
			t.Fatalf("record %d copies %+v, want positions %v", i, r.Copies, wantCopies[i])
		}
		for j, c := range r.Copies {
			if c.Position != wantCopies[i][j] || !c.Time.Equal(t0.Add(time.Duration(c.Position)*time.Second)) {
				t.Fatalf("record %d copy %d = %+v, want position %d", i, j, c, wantCopies[i][j])
			}
		}
		if r.Position != r.Copies[0].Position {
			t.Fatalf("record %d is not its first copy: %+v", i, r)
		}
	}
	if in[0].Copies != nil {
		t.Fatal("Collapse modified its input")
	}
}

func TestMarkerRecord(t *testing.T) {
	t.Parallel()
	hs := []Header{{Key: "Ringfence-Marker", Value: []byte(MarkerDLQ)}, {Key: HeaderTenantToken, Value: []byte("acme")}}
	if kind, ok := MarkerKind(hs); !ok || kind != MarkerDLQ {
		t.Fatalf("MarkerKind = %q, %v", kind, ok)
	}
	if _, err := DecodeRecord(nil, nil, hs); !errors.Is(err, ErrMarker) {
		t.Fatalf("DecodeRecord(marker) err = %v, want ErrMarker", err)
	}
	r := fullRecord()
	if _, ok := MarkerKind(r.EncodeHeaders()); ok {
		t.Fatal("a dead letter reads as a marker")
	}
}

package nats

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// wireHeader is what a stored record's headers look like when read back:
// the header block as nats.go writes it, decoded as nats.go decodes it.
func wireHeader(t *testing.T, h nats.Header) nats.Header {
	t.Helper()
	var b strings.Builder
	b.WriteString("NATS/1.0\r\n")
	for k, vs := range h {
		for _, v := range vs {
			b.WriteString(k + ": " + v + "\r\n")
		}
	}
	b.WriteString("\r\n")
	out, err := nats.DecodeHeadersMsg([]byte(b.String()))
	if err != nil {
		t.Fatalf("decode %q: %v", b.String(), err)
	}
	return out
}

// FuzzSpillRecord: any message, tenant key (outside input) and spill note
// is restored exactly from its spill record: inline, through NATS's header encoding,
// or out of line, through the body codec.
func FuzzSpillRecord(f *testing.F) {
	f.Add("acme", "orders.acme", []byte("v"), false, []byte(nil), "trace", []byte("t1"), "Nats-Msg-Id", []byte("x"), int64(7))
	f.Add("a b\r\n", "s", []byte{0, 0xff}, true, []byte("k"), "z", []byte(" padded "), "a", []byte(""), int64(-1))
	f.Add(strings.Repeat("long.", 300), "weird subject\n", []byte(nil), false, []byte(nil), "ringfence-spill-seq", []byte("9"), "Status", []byte("404"), int64(1)<<40)
	f.Fuzz(func(t *testing.T, tenant, topic string, value []byte, withKey bool, key []byte, k1 string, v1 []byte, k2 string, v2 []byte, off int64) {
		p := consumer.Partition{Topic: "SRC/work"}
		m := &consumer.Message{
			Value: value, Topic: topic, Stream: "SRC", Partition: p, Offset: off,
			Time:    time.Unix(1700000000, off%1e9).UTC(),
			Headers: []consumer.Header{{Key: k1, Value: v1}, {Key: k2, Value: v2}},
		}
		if withKey {
			m.Key = key
			if m.Key == nil {
				m.Key = []byte{}
			}
		}
		m.SetSpillNote(v2) // any bytes: the codec carries a note without reading it
		tok := dlq.TenantToken(tenant)
		h, inline := spillHeaders(tenant, tok, m)
		var got *consumer.Message
		var ref string
		var err error
		if full, _, ok := inlineRecord(h, m, 1<<20); inline && ok {
			got, ref, err = restoreRecord(wireHeader(t, full), m.Value, p)
			if err != nil || ref != "" {
				t.Fatalf("inline record restored with %v, body %q", err, ref)
			}
			if !exactValue(tenant) || len(tenant) > maxInlineTenant {
				if _, exact, _ := dlq.ParseTenantToken(tok); !exact {
					t.Fatalf("tenant %q is neither exact in its token nor in a header, yet inline", tenant)
				}
			} else if v := wireHeader(t, full).Get(hdrSpillTenant); v != tenant {
				t.Fatalf("tenant header %q, want %q", v, tenant)
			}
		} else {
			h[hdrSpillBody] = []string{"BUCKET/obj"}
			got, ref, err = restoreRecord(wireHeader(t, h), nil, p)
			if err != nil || ref != "BUCKET/obj" {
				t.Fatalf("pointer record restored with %v, body %q", err, ref)
			}
			var gt string
			gt, got.Key, got.Value, got.Headers, err = decodeBody(encodeBody(tenant, m.Key, m.Value, m.Headers))
			if err != nil || gt != tenant {
				t.Fatalf("body: tenant %q, %v", gt, err)
			}
		}
		if !got.Refed || got.Partition != p || got.Offset != off || got.Topic != topic || got.Stream != "SRC" || !got.Time.Equal(m.Time) {
			t.Fatalf("restored %+v, want %+v", got, m)
		}
		if !bytes.Equal(got.SpillNote(), m.SpillNote()) {
			t.Fatalf("note %q, want %q", got.SpillNote(), m.SpillNote())
		}
		if (got.Key == nil) != (m.Key == nil) || !bytes.Equal(got.Key, m.Key) || !bytes.Equal(got.Value, m.Value) {
			t.Fatalf("key %q value %q, want %q %q", got.Key, got.Value, m.Key, m.Value)
		}
		// Inline records come back grouped by name, in name order; a
		// message whose headers are not in that order goes out of line.
		if !slices.EqualFunc(got.Headers, m.Headers, func(a, b consumer.Header) bool { return a.Key == b.Key && bytes.Equal(a.Value, b.Value) }) {
			t.Fatalf("headers %q, want %q", got.Headers, m.Headers)
		}
	})
}

func TestWhichHeadersNATSCarriesExactly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		hs   []consumer.Header
		want bool
	}{
		{"none", nil, true},
		{"sorted, repeated", []consumer.Header{{Key: "a", Value: []byte("1")}, {Key: "a", Value: []byte("0")}, {Key: "b"}}, true},
		{"unsorted", []consumer.Header{{Key: "b"}, {Key: "a"}}, false},
		{"split name", []consumer.Header{{Key: "a"}, {Key: "b"}, {Key: "a"}}, false},
		{"spill header", []consumer.Header{{Key: "Ringfence-Spill-Seq", Value: []byte("1")}}, false},
		{"trimmed value", []consumer.Header{{Key: "a", Value: []byte(" x")}}, false},
		{"line break", []consumer.Header{{Key: "a", Value: []byte("x\ny")}}, false},
		{"bad name", []consumer.Header{{Key: "a:b"}}, false},
		{"Nats- header", []consumer.Header{{Key: "Nats-Msg-Id", Value: []byte("1")}}, true},
	} {
		if got := carriableHeaders(tc.hs); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

package dlq

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
)

// BenchmarkTenantToken compares the token encoding with what a user might
// pick instead: url.PathEscape (not legal: keeps '.', emits '%') and
// base64.RawURLEncoding (legal, but never readable).
func BenchmarkTenantToken(b *testing.B) {
	keys := []struct{ name, key string }{
		{"readable", "acme-corp-42"},
		{"escaped", "acme.corp/eu 42"},
		{"hashed", strings.Repeat("tenant.", 100)},
	}
	for _, k := range keys {
		b.Run("ringfence/"+k.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = TenantToken(k.key)
			}
		})
		b.Run("url.PathEscape/"+k.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = url.PathEscape(k.key)
			}
		})
		b.Run("base64/"+k.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = base64.RawURLEncoding.EncodeToString([]byte(k.key))
			}
		})
	}
}

func BenchmarkParseTenantToken(b *testing.B) {
	for _, tok := range []string{"acme-corp-42", TenantToken("acme.corp/eu 42")} {
		b.Run(tok, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _, _ = ParseTenantToken(tok)
			}
		})
	}
}

func BenchmarkEncodeHeaders(b *testing.B) {
	r := fullRecord()
	b.ReportAllocs()
	for b.Loop() {
		_ = r.EncodeHeaders()
	}
}

func BenchmarkDecodeRecord(b *testing.B) {
	r := fullRecord()
	hs := r.EncodeHeaders()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = DecodeRecord(r.Key, r.Value, hs)
	}
}

package dlq

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// legalToken reports whether tok uses only [A-Za-z0-9_-].
func legalToken(tok string) bool {
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; !literal(c) && c != '_' {
			return false
		}
	}
	return true
}

func TestTenantToken(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 10<<10)
	tests := []struct {
		name, key, want string
	}{
		{"readable", "acme-corp", "acme-corp"},
		{"digits", "tenant42", "tenant42"},
		{"mixed case", "AcmeCorp", "AcmeCorp"},
		{"uuid", "3f2b8c1e-9d4a-4e7b-a1c2-0f9e8d7c6b5a", "3f2b8c1e-9d4a-4e7b-a1c2-0f9e8d7c6b5a"},
		{"empty is no tenant", "", NoTenantToken},
		{"dot", "a.b", "a_2eb"},
		{"star", "*", "_2a"},
		{"gt", ">", "_3e"},
		{"space", "a b", "a_20b"},
		{"tab newline", "\t\n", "_09_0a"},
		{"path", "../etc", "_2e_2e_2fetc"},
		{"slash", "x/y", "x_2fy"},
		{"underscore", "a_b", "a_5fb"},
		{"invalid utf8", "\xff\xfe", "_ff_fe"},
		{"utf8", "é", "_c3_a9"},
		{"nul", "\x00", "_00"},
		{"looks like an escape", "acme_2ecorp", "acme_5f2ecorp"},
		{"looks like its escape", "acme.corp", "acme_2ecorp"},
		{"looks like no tenant", "_none", "_5fnone"},
		{"looks like hashed", "_h0123456789abcdef0123456789abcdef", "_5fh0123456789abcdef0123456789abcdef"},
		{"longest plain", strings.Repeat("a", MaxTokenLen), strings.Repeat("a", MaxTokenLen)},
		{"longest escaped", strings.Repeat(".", MaxTokenLen/3), strings.Repeat("_2e", MaxTokenLen/3)},
		{"hashed plain", strings.Repeat("a", MaxTokenLen+1), strings.Repeat("a", hashedPrefixMax) + "_h9ce4e58a8e1314bf14ca8a52ac20fa1b"},
		{"hashed 10KB", long, strings.Repeat("x", hashedPrefixMax) + "_h04f8f86af2cd14ffe9bbe8da1518ce9c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := TenantToken(tt.key)
			if got != tt.want {
				t.Fatalf("TenantToken(%q) = %q, want %q", trim(tt.key), got, tt.want)
			}
			if !legalToken(got) || len(got) > MaxTokenLen || got == "" {
				t.Fatalf("TenantToken(%q) = %q: illegal or too long (%d)", trim(tt.key), got, len(got))
			}
			back, ok, err := ParseTenantToken(got)
			if err != nil {
				t.Fatalf("ParseTenantToken(%q): %v", got, err)
			}
			hashed := strings.Contains(got, hashMark)
			if ok == hashed {
				t.Fatalf("ParseTenantToken(%q): ok = %v for hashed = %v", got, ok, hashed)
			}
			if ok && back != tt.key {
				t.Fatalf("ParseTenantToken(%q) = %q, want %q", got, trim(back), trim(tt.key))
			}
			if !ok && !strings.HasPrefix(tt.key, back) {
				t.Fatalf("hashed token %q decodes to %q, not a prefix of the key", got, back)
			}
		})
	}
}

func trim(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// The hashed prefix is cut on an escape boundary whatever the mix of plain
// and escaped bytes, and keys sharing that prefix still get distinct tokens.
func TestTenantTokenHashedBoundaries(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	for lead := 0; lead < 6; lead++ {
		for _, tail := range []string{".", "a", "\xff"} {
			key := strings.Repeat("a", lead) + strings.Repeat(".", 80) + tail
			tok := TenantToken(key)
			if len(tok) > MaxTokenLen || !legalToken(tok) {
				t.Fatalf("token %q: illegal or %d long", tok, len(tok))
			}
			prefix, ok, err := ParseTenantToken(tok)
			if err != nil || ok {
				t.Fatalf("ParseTenantToken(%q) = %v, %v; want hashed", tok, ok, err)
			}
			if !strings.HasPrefix(key, prefix) {
				t.Fatalf("prefix %q is not a prefix of %q", prefix, key)
			}
			if other, dup := seen[tok]; dup {
				t.Fatalf("keys %q and %q share token %q", other, key, tok)
			}
			seen[tok] = key
		}
	}
}

func TestTenantTokenNoAllocReadable(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = TenantToken("acme-corp") }); n != 0 {
		t.Fatalf("TenantToken on a readable id: %v allocs, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = TenantToken("acme.corp") }); n != 1 {
		t.Fatalf("TenantToken on an escaped id: %v allocs, want 1", n)
	}
}

func TestParseTenantTokenRejects(t *testing.T) {
	t.Parallel()
	hash := strings.Repeat("0", hashHexLen)
	tests := []struct{ name, tok string }{
		{"empty", ""},
		{"dot", "a.b"},
		{"star", "*"},
		{"space", "a b"},
		{"non-ascii", "é"},
		{"lone underscore", "_"},
		{"short escape", "a_2"},
		{"uppercase hex", "a_2E"},
		{"needless escape of a letter", "_61"},
		{"needless escape of a dash", "_2d"},
		{"not hex", "_zz"},
		{"reserved-looking", "_nonE"},
		{"too long", strings.Repeat("a", MaxTokenLen+1)},
		{"hash too short", strings.Repeat("a", hashedPrefixMax) + "_h" + hash[1:]},
		{"hash uppercase", strings.Repeat("a", hashedPrefixMax) + "_h" + strings.Repeat("A", hashHexLen)},
		{"hash prefix too short", "acme_h" + hash},
		{"hash bad prefix", strings.Repeat("a", hashedPrefixMax-3) + "_2d_h" + hash},
		{"two marks", strings.Repeat("a", hashedPrefixMax) + "_h_h" + hash[4:]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok, err := ParseTenantToken(tt.tok)
			if !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("ParseTenantToken(%q) = %q, %v, %v; want ErrInvalidToken", trim(tt.tok), got, ok, err)
			}
			if !strings.HasPrefix(err.Error(), "dlq: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestTopicAndSubjectNames(t *testing.T) {
	t.Parallel()
	if got, want := KafkaTopic("orders", "acme.corp"), "orders.dlq.acme_2ecorp"; got != want {
		t.Errorf("KafkaTopic = %q, want %q", got, want)
	}
	if got, want := NoTenantKafkaTopic("orders"), "orders.dlq._none"; got != want {
		t.Errorf("NoTenantKafkaTopic = %q, want %q", got, want)
	}
	if got, want := KafkaTopic("orders", ""), NoTenantKafkaTopic("orders"); got != want {
		t.Errorf("KafkaTopic with empty key = %q, want %q", got, want)
	}
	if got, want := NATSSubject("dlq.orders", "a.*>"), "dlq.orders.a_2e_2a_3e"; got != want {
		t.Errorf("NATSSubject = %q, want %q", got, want)
	}
	if got, want := NoTenantNATSSubject("dlq.orders"), "dlq.orders._none"; got != want {
		t.Errorf("NoTenantNATSSubject = %q, want %q", got, want)
	}

	// The worst case fits Kafka's limit.
	src := strings.Repeat("s", MaxKafkaSourceLen)
	for _, key := range []string{strings.Repeat("a", 5000), strings.Repeat("\xff", 5000), strings.Repeat(".a", 2500)} {
		topic := KafkaTopic(src, key)
		if len(topic) > 249 {
			t.Errorf("KafkaTopic length %d > 249", len(topic))
		}
		gotSrc, tok, ok := SplitKafkaTopic(topic)
		if !ok || gotSrc != src || tok != TenantToken(key) {
			t.Errorf("SplitKafkaTopic(%q) = %q, %q, %v", topic, gotSrc, tok, ok)
		}
	}

	splits := []struct {
		topic, src, tok string
		ok              bool
	}{
		{"orders.dlq.acme", "orders", "acme", true},
		{"a.dlq.b.dlq.c", "a.dlq.b", "c", true},
		{"orders.dlq.", "", "", false},
		{"orders.dlq.a.b", "", "", false},
		{"orders", "", "", false},
	}
	for _, s := range splits {
		src, tok, ok := SplitKafkaTopic(s.topic)
		if src != s.src || tok != s.tok || ok != s.ok {
			t.Errorf("SplitKafkaTopic(%q) = %q, %q, %v; want %q, %q, %v", s.topic, src, tok, ok, s.src, s.tok, s.ok)
		}
	}
	if tok, ok := SplitNATSSubject("dlq.orders", "dlq.orders.acme_2ecorp"); !ok || tok != "acme_2ecorp" {
		t.Errorf("SplitNATSSubject = %q, %v", tok, ok)
	}
	for _, subj := range []string{"dlq.orders", "dlq.orders.", "dlq.orders.a.b", "dlq.ordersx.a", "other.a"} {
		if tok, ok := SplitNATSSubject("dlq.orders", subj); ok {
			t.Errorf("SplitNATSSubject(%q) = %q, true; want false", subj, tok)
		}
	}
}

// FuzzTenantToken checks, for any two keys a and b: tokens use the legal
// alphabet, fit MaxTokenLen, decode back (or, hashed, to a prefix of the
// key), and differ when the keys differ. It also checks that any string
// ParseTenantToken accepts as plain is exactly the token of what it decodes
// to, so no alias of a tenant's token exists.
func FuzzTenantToken(f *testing.F) {
	for _, s := range []string{"", "acme-corp", "a.b", "*", ">", "a b", "../etc", "\xff", "_none", "acme_2ecorp",
		"acme.corp", "_h", strings.Repeat("a", MaxTokenLen+1), strings.Repeat(".", 61), "é"} {
		f.Add(s, "acme-corp")
	}
	f.Add("acme_2ecorp", "acme.corp")
	f.Fuzz(func(t *testing.T, a, b string) {
		tok := TenantToken(a)
		if tok == "" || len(tok) > MaxTokenLen || !legalToken(tok) {
			t.Fatalf("TenantToken(%q) = %q: empty, illegal or too long", a, tok)
		}
		back, ok, err := ParseTenantToken(tok)
		if err != nil {
			t.Fatalf("ParseTenantToken(TenantToken(%q) = %q): %v", a, tok, err)
		}
		if hashed := strings.Contains(tok, hashMark); ok == hashed {
			t.Fatalf("ParseTenantToken(%q): ok = %v, hashed = %v", tok, ok, hashed)
		}
		if ok && back != a {
			t.Fatalf("round trip %q -> %q -> %q", a, tok, back)
		}
		if !ok && !strings.HasPrefix(a, back) {
			t.Fatalf("hashed %q -> %q decodes to %q, not a prefix", a, tok, back)
		}
		if a != b && TenantToken(b) == tok {
			t.Fatalf("keys %q and %q share token %q", a, b, tok)
		}

		// a as a token: accepted only if canonical.
		got, ok, err := ParseTenantToken(a)
		if err == nil && ok && TenantToken(got) != a {
			t.Fatalf("ParseTenantToken(%q) = %q, but its token is %q", a, got, TenantToken(got))
		}
		if err == nil && !ok && (!legalToken(a) || !utf8.ValidString(a) || !strings.Contains(a, hashMark)) {
			t.Fatalf("ParseTenantToken(%q) accepted a non-token as hashed", a)
		}
	})
}

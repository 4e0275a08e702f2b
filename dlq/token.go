package dlq

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Token limits and reserved tokens.
const (
	// MaxTokenLen is the longest token TenantToken returns. Keys whose
	// encoding would be longer are hashed. 180 leaves room for
	// "<source>.dlq.<token>" within Kafka's 249-character topic limit for
	// source topics of up to MaxKafkaSourceLen characters.
	MaxTokenLen = 180

	// MaxKafkaSourceLen is the longest source topic for which KafkaTopic
	// always returns a legal Kafka topic name (249 characters at most).
	MaxKafkaSourceLen = 249 - len(KafkaInfix) - MaxTokenLen

	// KafkaInfix separates the source topic from the token in a Kafka DLQ
	// topic name.
	KafkaInfix = ".dlq."

	// NoTenantToken names the "no tenant" bucket: messages whose key was
	// missing, empty or refused. It is TenantToken(""). No other key
	// encodes to it, since "_n" is not an escape.
	NoTenantToken = "_none"

	// hashMark separates a hashed token's readable prefix from its hash.
	// 'h' is not a hex digit, so the mark never occurs in an escaped token.
	hashMark = "_h"
	// hashHexLen is how many hex digits of the SHA-256 a hashed token keeps
	// (128 bits).
	hashHexLen = 32
	// hashedPrefixMax is the longest readable prefix of a hashed token.
	hashedPrefixMax = MaxTokenLen - len(hashMark) - hashHexLen
	// hashedPrefixMin is the shortest: the prefix is cut on an escape
	// boundary, losing at most two characters of an escape.
	hashedPrefixMin = hashedPrefixMax - 2
)

// ErrInvalidToken: a string is not a token TenantToken could have returned.
var ErrInvalidToken = errors.New("dlq: invalid tenant token")

const lowerHex = "0123456789abcdef"

// literal reports whether c stands for itself in a token.
func literal(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-'
}

// TenantToken encodes a tenant key (any bytes) as a token usable in a Kafka
// topic name and as one NATS subject token. See the package documentation
// for the rules. A key made only of [A-Za-z0-9-] and at most MaxTokenLen
// long is its own token and costs no allocation.
func TenantToken(tenant string) string {
	if tenant == "" {
		return NoTenantToken
	}
	n := 0
	for i := 0; i < len(tenant); i++ {
		if literal(tenant[i]) {
			n++
		} else {
			n += 3
		}
	}
	if n == len(tenant) && n <= MaxTokenLen {
		return tenant
	}
	// Every token fits MaxTokenLen: build it on the stack, allocate once.
	var buf [MaxTokenLen]byte
	if n <= MaxTokenLen {
		return string(appendEscaped(buf[:0], tenant, n))
	}
	b := appendEscaped(buf[:0], tenant, hashedPrefixMax)
	b = append(b, hashMark...)
	sum := sha256.Sum256([]byte(tenant))
	b = hex.AppendEncode(b, sum[:hashHexLen/2])
	return string(b)
}

// appendEscaped appends the escaped form of s, stopping before the first
// byte whose encoding would make the result longer than limit.
func appendEscaped(b []byte, s string, limit int) []byte {
	limit += len(b)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if literal(c) {
			if len(b)+1 > limit {
				break
			}
			b = append(b, c)
			continue
		}
		if len(b)+3 > limit {
			break
		}
		b = append(b, '_', lowerHex[c>>4], lowerHex[c&0xf])
	}
	return b
}

// ParseTenantToken decodes a token made by TenantToken. For a plain token it
// returns the key and ok = true. For a hashed token it returns ok = false and,
// as tenant, the key's readable prefix (for display only: the full key is in
// the records' HeaderTenant). NoTenantToken decodes to "", true. Anything
// TenantToken cannot return, including non-canonical escapes such as "_2D"
// or "_61", is an error wrapping ErrInvalidToken.
func ParseTenantToken(tok string) (tenant string, ok bool, err error) {
	switch {
	case tok == NoTenantToken:
		return "", true, nil
	case tok == "":
		return "", false, invalidToken(tok, "empty")
	case len(tok) > MaxTokenLen:
		return "", false, invalidToken(tok, fmt.Sprintf("longer than %d", MaxTokenLen))
	}
	i := strings.Index(tok, hashMark)
	if i < 0 {
		tenant, err = unescape(tok)
		return tenant, err == nil, err
	}
	prefix, sum := tok[:i], tok[i+len(hashMark):]
	if len(sum) != hashHexLen || !isLowerHex(sum) {
		return "", false, invalidToken(tok, "hash is not 32 lowercase hex digits")
	}
	if len(prefix) < hashedPrefixMin || len(prefix) > hashedPrefixMax {
		return "", false, invalidToken(tok, "hashed token prefix has the wrong length")
	}
	tenant, err = unescape(prefix)
	return tenant, false, err
}

// unescape decodes a canonical escaped string, which must not be empty.
func unescape(s string) (string, error) {
	if s == "" {
		return "", invalidToken(s, "empty")
	}
	plain := true
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case literal(c):
			i++
		case c == '_':
			if i+2 >= len(s) || !isLowerHex(s[i+1:i+3]) {
				return "", invalidToken(s, fmt.Sprintf("bad escape at %d", i))
			}
			if literal(unhex(s[i+1])<<4 | unhex(s[i+2])) {
				return "", invalidToken(s, fmt.Sprintf("needless escape at %d", i))
			}
			plain = false
			i += 3
		default:
			return "", invalidToken(s, fmt.Sprintf("illegal byte %#x at %d", c, i))
		}
	}
	if plain {
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		if s[i] != '_' {
			b = append(b, s[i])
			i++
			continue
		}
		b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
		i += 3
	}
	return string(b), nil
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// unhex decodes one lowercase hex digit already checked by isLowerHex.
func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}

func invalidToken(tok, why string) error {
	if len(tok) > 64 {
		tok = tok[:64] + "..."
	}
	return fmt.Errorf("%w %q: %s", ErrInvalidToken, tok, why)
}

// KafkaTopic names the tenant's DLQ topic for a source topic:
// "<source>.dlq.<token>". The result is a legal Kafka topic name when source
// is one of at most MaxKafkaSourceLen characters. Tokens contain no '.', so
// two tenants' topics of one source never collide under Kafka's rule that
// topics differing only in '.' versus '_' conflict.
func KafkaTopic(source, tenant string) string {
	return source + KafkaInfix + TenantToken(tenant)
}

// NoTenantKafkaTopic names the source's "no tenant" DLQ topic.
func NoTenantKafkaTopic(source string) string {
	return source + KafkaInfix + NoTenantToken
}

// SplitKafkaTopic splits a DLQ topic name made by KafkaTopic into its source
// topic and token. ok is false when topic has no ".dlq." followed by a
// dot-free, non-empty token; the token itself is not validated (use
// ParseTenantToken).
func SplitKafkaTopic(topic string) (source, token string, ok bool) {
	i := strings.LastIndex(topic, KafkaInfix)
	if i < 0 {
		return "", "", false
	}
	source, token = topic[:i], topic[i+len(KafkaInfix):]
	if token == "" || strings.IndexByte(token, '.') >= 0 {
		return "", "", false
	}
	return source, token, true
}

// NATSSubject names the tenant's DLQ subject under prefix:
// "<prefix>.<token>". The token is exactly one subject token.
func NATSSubject(prefix, tenant string) string {
	return prefix + "." + TenantToken(tenant)
}

// NoTenantNATSSubject names the "no tenant" DLQ subject under prefix.
func NoTenantNATSSubject(prefix string) string {
	return prefix + "." + NoTenantToken
}

// SplitNATSSubject returns the token of a DLQ subject made by NATSSubject
// with the same prefix. ok is false when subject is not "<prefix>.<token>"
// with a single non-empty token; the token itself is not validated.
func SplitNATSSubject(prefix, subject string) (token string, ok bool) {
	rest, found := strings.CutPrefix(subject, prefix+".")
	if !found || rest == "" || strings.IndexByte(rest, '.') >= 0 {
		return "", false
	}
	return rest, true
}

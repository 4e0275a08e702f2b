package nats

import (
	"strings"
	"testing"

	"github.com/ringfence/ringfence/consumer"
)

// FuzzFromSubjectToken checks the token picker against strings.Split on
// any subject (subjects are outside input).
func FuzzFromSubjectToken(f *testing.F) {
	for _, s := range []string{"orders.acme.created", "", ".", "a..b", "single", "a.b.", ".a"} {
		f.Add(s, 1)
		f.Add(s, -1)
	}
	f.Fuzz(func(t *testing.T, subject string, i int) {
		parts := strings.Split(subject, ".")
		j := i
		if j < 0 {
			j += len(parts)
		}
		got, err := FromSubjectToken(i)(&consumer.Message{Topic: subject})
		if j < 0 || j >= len(parts) || parts[j] == "" {
			if err == nil {
				t.Fatalf("%q[%d] = %q, want ErrNoTenant", subject, i, got)
			}
			return
		}
		if err != nil || got != parts[j] {
			t.Fatalf("%q[%d] = %q, %v; want %q", subject, i, got, err, parts[j])
		}
	})
}

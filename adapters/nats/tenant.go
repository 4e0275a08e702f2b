package nats

import (
	"fmt"
	"strings"

	"github.com/ringfence/ringfence/consumer"
)

// FromSubjectToken takes the tenant from token i of the message subject
// (Message.Topic), counted from 0; a negative i counts from the end (-1 is
// the last token). A subject too short to have that token yields an error
// wrapping consumer.ErrNoTenant.
func FromSubjectToken(i int) consumer.TenantFunc {
	return func(m *consumer.Message) (string, error) {
		tok, ok := subjectToken(m.Topic, i)
		if !ok || tok == "" {
			return "", fmt.Errorf("%w: subject %q has no token %d", consumer.ErrNoTenant, m.Topic, i)
		}
		return tok, nil
	}
}

func subjectToken(subject string, i int) (string, bool) {
	if i < 0 {
		n := strings.Count(subject, ".") + 1
		i += n
		if i < 0 {
			return "", false
		}
	}
	for ; i > 0; i-- {
		j := strings.IndexByte(subject, '.')
		if j < 0 {
			return "", false
		}
		subject = subject[j+1:]
	}
	if j := strings.IndexByte(subject, '.'); j >= 0 {
		subject = subject[:j]
	}
	return subject, true
}

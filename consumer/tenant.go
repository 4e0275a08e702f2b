package consumer

import "errors"

// ErrNoTenant: the message carries no tenant key. Such a message is
// dead-lettered under the reserved "no tenant" bucket, never dropped.
var ErrNoTenant = errors.New("consumer: message has no tenant key")

// TenantFunc extracts the tenant key from a message. The key may be any
// bytes. Return an error wrapping ErrNoTenant when there is none, or another
// error when the key is unusable; either way the message goes to the
// "no tenant" dead-letter bucket with the error as its reason.
type TenantFunc func(m *Message) (string, error)

// FromHeader takes the tenant from the first header named name.
func FromHeader(name string) TenantFunc {
	return func(m *Message) (string, error) {
		v, ok := m.Header(name)
		if !ok || len(v) == 0 {
			return "", ErrNoTenant
		}
		return string(v), nil
	}
}

// FromKey takes the tenant from the message key.
func FromKey() TenantFunc {
	return func(m *Message) (string, error) {
		if len(m.Key) == 0 {
			return "", ErrNoTenant
		}
		return string(m.Key), nil
	}
}

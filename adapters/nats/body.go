package nats

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ringfence/ringfence/dlq"
)

// A dead letter too large for one NATS message (or with bytes a NATS
// message cannot carry: a key, a header name NATS refuses, a header value
// NATS would trim or change) is stored out of line: its original message
// (tenant key, message key, headers, value) as one object in the DLQ's
// object store, in the form below, and the DLQ record names the object in
// hdrBody.
//
//	"RFDLQB1\n"
//	uvarint len(tenant), tenant
//	uvarint 0 (no key) or len(key)+1, key
//	uvarint len(headers); per header: uvarint len(key), key, uvarint len(value), value
//	uvarint len(value), value
const bodyMagic = "RFDLQB1\n"

// errBody: an object that is not a body encodeBody wrote.
var errBody = errors.New("nats: malformed dead-letter body")

// encodeBody encodes a dead letter's original message.
func encodeBody(tenant string, key, value []byte, headers []dlq.Header) []byte {
	n := len(bodyMagic) + 4*binary.MaxVarintLen64 + len(tenant) + len(key) + len(value)
	for _, h := range headers {
		n += 2*binary.MaxVarintLen64 + len(h.Key) + len(h.Value)
	}
	b := make([]byte, 0, n)
	b = append(b, bodyMagic...)
	b = binary.AppendUvarint(b, uint64(len(tenant)))
	b = append(b, tenant...)
	if key == nil {
		b = binary.AppendUvarint(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(key))+1)
		b = append(b, key...)
	}
	b = binary.AppendUvarint(b, uint64(len(headers)))
	for _, h := range headers {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		b = binary.AppendUvarint(b, uint64(len(h.Value)))
		b = append(b, h.Value...)
	}
	b = binary.AppendUvarint(b, uint64(len(value)))
	return append(b, value...)
}

// decodeBody decodes what encodeBody wrote. The results alias b.
func decodeBody(b []byte) (tenant string, key, value []byte, headers []dlq.Header, err error) {
	if len(b) < len(bodyMagic) || string(b[:len(bodyMagic)]) != bodyMagic {
		return "", nil, nil, nil, fmt.Errorf("%w: no %q prefix", errBody, bodyMagic[:len(bodyMagic)-1])
	}
	d := bodyDecoder{b: b[len(bodyMagic):]}
	tenant = string(d.bytes())
	if k := d.uvarint(); k > 0 {
		if k-1 > uint64(len(d.b)) {
			d.err = fmt.Errorf("%w: key length %d beyond the %d bytes left", errBody, k-1, len(d.b))
		} else {
			key, d.b = d.b[:k-1:k-1], d.b[k-1:]
		}
	}
	nh := d.uvarint()
	// Every header takes at least two bytes: a count beyond that is a lie
	// that must not become an allocation.
	if d.err == nil && nh > uint64(len(d.b))/2 {
		d.err = fmt.Errorf("%w: %d headers in %d bytes", errBody, nh, len(d.b))
	}
	if d.err == nil && nh > 0 {
		headers = make([]dlq.Header, 0, nh)
		for range nh {
			k := d.bytes()
			v := d.bytes()
			if d.err != nil {
				break
			}
			headers = append(headers, dlq.Header{Key: string(k), Value: v})
		}
	}
	value = d.bytes()
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d bytes after the value", errBody, len(d.b))
	}
	if d.err != nil {
		return "", nil, nil, nil, d.err
	}
	return tenant, key, value, headers, nil
}

type bodyDecoder struct {
	b   []byte
	err error
}

func (d *bodyDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = fmt.Errorf("%w: bad length", errBody)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *bodyDecoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: length %d beyond the %d bytes left", errBody, n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

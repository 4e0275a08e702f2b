package nats

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/flight"
)

// A dead letter or spilled message too large for one NATS message (or with
// bytes a NATS message cannot carry: a key, a header name NATS refuses, a
// header value NATS would trim or change) is stored out of line: its
// original message (tenant key, message key, headers, value) as one object
// in the DLQ's or spill log's object store bucket, in the form below, and
// the record in the stream names the object in hdrBody.
//
//	"RFDLQB1\n"
//	uvarint len(tenant), tenant
//	uvarint 0 (no key) or len(key)+1, key
//	uvarint len(headers); per header: uvarint len(key), key, uvarint len(value), value
//	uvarint len(value), value
const bodyMagic = "RFDLQB1\n"

// errBody: an object that is not a body encodeBody wrote.
var errBody = errors.New("nats: malformed stored body")

// encodeBody encodes a dead letter's or spilled message's original.
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

// bodyStore keeps records stored out of line (see encodeBody) in JetStream
// object store buckets: the DLQ's and the spill log's. It is safe for
// concurrent use; one open of a bucket runs at a time, with no lock held
// while it does.
type bodyStore struct {
	js jetstream.JetStream
	// own is the bucket this writer puts bodies in, created on first need
	// when create is set (with desc and meta).
	own    string
	create bool
	desc   string
	meta   map[string]string

	stores flight.Group[jetstream.ObjectStore] // bucket -> opened store
}

// put stores b in the own bucket as "<dir>/<random>" and returns
// "<bucket>/<object>".
func (s *bodyStore) put(ctx context.Context, dir string, b []byte) (string, error) {
	store, err := s.open(ctx, s.own)
	if err != nil {
		return "", err
	}
	var r [16]byte
	_, _ = rand.Read(r[:])
	name := dir + "/" + hex.EncodeToString(r[:])
	if _, err := store.PutBytes(ctx, name, b); err != nil {
		return "", fmt.Errorf("nats: store body in %s: %w", s.own, err)
	}
	return s.own + "/" + name, nil
}

// get reads the body ref names.
func (s *bodyStore) get(ctx context.Context, ref string) ([]byte, error) {
	bucket, name, ok := strings.Cut(ref, "/")
	if !ok {
		return nil, fmt.Errorf("%w: bad %s %q", errBody, hdrBody, ref)
	}
	store, err := s.open(ctx, bucket)
	if err != nil {
		return nil, err
	}
	b, err := store.GetBytes(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("nats: body %s: %w", ref, err)
	}
	return b, nil
}

// drop deletes a stored body, best effort: one that outlives its record
// only takes space.
func (s *bodyStore) drop(ctx context.Context, ref string) {
	bucket, name, ok := strings.Cut(ref, "/")
	if !ok {
		return
	}
	if store, err := s.open(ctx, bucket); err == nil {
		_ = store.Delete(ctx, name)
	}
}

// open opens bucket, creating the own bucket when allowed.
func (s *bodyStore) open(ctx context.Context, bucket string) (jetstream.ObjectStore, error) {
	return s.stores.Do(ctx, bucket, func(ctx context.Context) (jetstream.ObjectStore, error) {
		store, err := s.js.ObjectStore(ctx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) && s.create && bucket == s.own {
			store, err = s.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
				Bucket:      bucket,
				Description: s.desc,
				Storage:     jetstream.FileStorage,
				Metadata:    s.meta,
			})
			if errors.Is(err, jetstream.ErrBucketExists) {
				store, err = s.js.ObjectStore(ctx, bucket)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("nats: object store %s: %w", bucket, err)
		}
		return store, nil
	})
}

// bucketName names the object store bucket of a stream: the stream's name
// with "_BODIES" when that is a legal bucket name, else hashPrefix and a
// hash of it.
func bucketName(stream, hashPrefix string) string {
	ok := true
	for i := 0; i < len(stream); i++ {
		c := stream[i]
		ok = ok && ('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-')
	}
	if ok && len(stream) <= 200 {
		return stream + "_BODIES"
	}
	sum := sha256.Sum256([]byte(stream))
	return hashPrefix + hex.EncodeToString(sum[:8])
}

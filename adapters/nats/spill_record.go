package nats

// The spill record format: what Append writes for a message and Read
// turns back into it. Pure functions, fuzzed.

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// Headers of a spill record. Read removes them (and every "Nats-" header
// the server adds) before the message goes back to the engine.
const (
	hdrSpillPrefix  = "ringfence-spill-"
	hdrSpillTenant  = "ringfence-spill-tenant"
	hdrSpillSubject = "ringfence-spill-subject"
	hdrSpillStream  = "ringfence-spill-stream"
	hdrSpillSeq     = "ringfence-spill-seq"
	hdrSpillTime    = "ringfence-spill-time"
	// hdrSpillNote is the engine's note on the message (see
	// consumer.Message.SpillNote); absent when it has none.
	hdrSpillNote = "ringfence-spill-note"
	// hdrSpillBody names the object ("<bucket>/<object>") holding a record
	// stored out of line.
	hdrSpillBody = "ringfence-spill-body"
	// hdrSpillNats prefixes the original's "Nats-" headers, which the spill
	// stream would otherwise act on (Nats-Msg-Id, Nats-Expected-*,
	// Nats-TTL).
	hdrSpillNats = "ringfence-spill-h-"
	// quotedSuffix marks a header holding strconv.Quote of a value a NATS
	// header would not carry exactly.
	quotedSuffix = "-q"
	// spillMsgIDPrefix starts a spill record's Nats-Msg-Id:
	// "ringfence-spill:<tenant token>:<partition topic>/<partition id>/<offset>".
	spillMsgIDPrefix = "ringfence-spill:"
)

// spillHeaders returns the spill headers of m in the subject of tenant's
// token tok, and whether m may go inline (as the record's own headers and
// data): it has no key, its headers are carriable, and the tenant key is
// exact in the token or a header (else only the body can hold it).
func spillHeaders(tenant, tok string, m *consumer.Message) (nats.Header, bool) {
	_, exactTok, _ := dlq.ParseTenantToken(tok)
	tenantInline := exactValue(tenant) && len(tenant) <= maxInlineTenant
	h := make(nats.Header, len(m.Headers)+8)
	setExact(h, hdrSpillSubject, m.Topic)
	if m.Stream != "" {
		setExact(h, hdrSpillStream, m.Stream)
	}
	h[hdrSpillSeq] = []string{strconv.FormatInt(m.Offset, 10)}
	h[hdrSpillTime] = []string{m.Time.UTC().Format(time.RFC3339Nano)}
	if tenantInline {
		h[hdrSpillTenant] = []string{tenant}
	}
	if note := m.SpillNote(); note != nil {
		setExact(h, hdrSpillNote, string(note))
	}
	if id := spillMsgID(tok, m); exactValue(id) {
		h[jetstream.MsgIDHeader] = []string{id}
	}
	return h, m.Key == nil && (tenantInline || exactTok) && carriableHeaders(m.Headers)
}

// inlineRecord adds m's own headers to the spill headers h, the "Nats-"
// ones renamed, and reports the record's size and whether it fits limit
// and JetStream's header block.
func inlineRecord(h nats.Header, m *consumer.Message, limit int64) (nats.Header, int64, bool) {
	full := maps.Clone(h)
	for _, x := range m.Headers {
		k := x.Key
		if strings.HasPrefix(k, "Nats-") {
			k = hdrSpillNats + k
		}
		full[k] = append(full[k], string(x.Value))
	}
	n := msgSize(full, m.Value)
	return full, n, n <= limit && msgSize(full, nil) <= maxHeaderBlock
}

// setExact sets header key to v, or key+"-q" to strconv.Quote(v) when a
// NATS header would not carry v exactly.
func setExact(h nats.Header, key, v string) {
	if exactValue(v) {
		h[key] = []string{v}
		return
	}
	h[key+quotedSuffix] = []string{strconv.Quote(v)}
}

// getExact reads what setExact wrote.
func getExact(h nats.Header, key string) (string, error) {
	if v, ok := h[key]; ok && len(v) > 0 {
		return v[0], nil
	}
	if v, ok := h[key+quotedSuffix]; ok && len(v) > 0 {
		u, err := strconv.Unquote(v[0])
		if err != nil {
			return "", fmt.Errorf("%w: bad %s%s: %v", errNotSpillRecord, key, quotedSuffix, err)
		}
		return u, nil
	}
	return "", nil
}

// spillMsgID is the Nats-Msg-Id of m's spill record in the subject of the
// tenant token tok.
func spillMsgID(tok string, m *consumer.Message) string {
	return spillMsgIDPrefix + tok + ":" + m.Partition.Topic + "/" + strconv.FormatInt(int64(m.Partition.ID), 10) + "/" + strconv.FormatInt(m.Offset, 10)
}

// carriableHeaders reports whether a NATS message carries hs exactly and
// Read gives them back in the same order: names NATS accepts and no spill
// header, values NATS does not trim or rewrite, sorted by name (Read lists
// a NATS header's names in order, each name's values in theirs).
func carriableHeaders(hs []consumer.Header) bool {
	for i, h := range hs {
		if !validHeaderKey(h.Key) || hasPrefixFold(h.Key, hdrSpillPrefix) || !exactValue(string(h.Value)) {
			return false
		}
		if i > 0 && hs[i-1].Key > h.Key {
			return false
		}
	}
	return true
}

// errNotSpillRecord: a message in the spill stream that no SpillLog wrote.
var errNotSpillRecord = errors.New("nats: not a spill record")

// restoreRecord turns a record's headers and data back into the original
// message of partition p (Refed set). A record stored out of line comes
// back without key, value and headers, and with the body's reference.
func restoreRecord(h nats.Header, data []byte, p consumer.Partition) (*consumer.Message, string, error) {
	off, err := strconv.ParseInt(h.Get(hdrSpillSeq), 10, 64)
	if err != nil {
		return nil, "", fmt.Errorf("%w: no valid %s header", errNotSpillRecord, hdrSpillSeq)
	}
	m := &consumer.Message{Partition: p, Offset: off, Refed: true}
	if m.Topic, err = getExact(h, hdrSpillSubject); err != nil {
		return nil, "", err
	}
	if m.Stream, err = getExact(h, hdrSpillStream); err != nil {
		return nil, "", err
	}
	if t, err := time.Parse(time.RFC3339Nano, h.Get(hdrSpillTime)); err == nil {
		m.Time = t
	}
	// A note that does not unquote is dropped, not the record: the engine
	// judges the message afresh.
	if note, err := getExact(h, hdrSpillNote); err == nil && note != "" {
		m.SetSpillNote([]byte(note))
	}
	if ref := h.Get(hdrSpillBody); ref != "" {
		return m, ref, nil
	}
	m.Value = data
	orig := make(nats.Header, len(h))
	for k, v := range h {
		switch {
		case strings.HasPrefix(k, hdrSpillNats):
			orig[k[len(hdrSpillNats):]] = v
		case hasPrefixFold(k, hdrSpillPrefix), strings.HasPrefix(k, "Nats-"):
			// the spill record's own, or the server's
		default:
			orig[k] = v
		}
	}
	m.Headers = fromNATSHeader(orig)
	return m, "", nil
}

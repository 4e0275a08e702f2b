package kafka

// The record format of spill topics: the original message's key, value and
// headers, byte for byte, followed by ringfence-spill- headers.

import (
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/consumer"
)

// Headers a SpillLog adds after the original message's headers. A reader
// takes the first N headers as the original's, N being the value of
// SpillHeaderCount (always the last header), so an original header that
// happens to start with SpillHeaderPrefix is kept too.
const (
	// SpillHeaderPrefix starts every header a SpillLog adds.
	SpillHeaderPrefix = "ringfence-spill-"
	// SpillHeaderSource is the original's topic.
	SpillHeaderSource = "ringfence-spill-source"
	// SpillHeaderPartition is the original's partition, in decimal.
	SpillHeaderPartition = "ringfence-spill-partition"
	// SpillHeaderOffset is the original's offset, in decimal.
	SpillHeaderOffset = "ringfence-spill-offset"
	// SpillHeaderTime is the original's time, RFC 3339 with nanoseconds;
	// absent for a zero time (or one outside years 0-9999).
	SpillHeaderTime = "ringfence-spill-time"
	// SpillHeaderStream is the original's stream; absent when empty (it
	// is always empty for Kafka).
	SpillHeaderStream = "ringfence-spill-stream"
	// SpillHeaderGroup is the consumer group that spilled the record. Two
	// groups reading one source share its spill topics; each reads back
	// only its own records.
	SpillHeaderGroup = "ringfence-spill-group"
	// SpillHeaderTenant is the full tenant key (in an old per-tenant spill
	// topic, written only when the topic's token is hashed).
	SpillHeaderTenant = "ringfence-spill-tenant"
	// SpillHeaderID is the dedupe id, "<topic>/<partition>/<offset>" of the
	// original: copies of one message (a re-appended batch) share it.
	SpillHeaderID = "ringfence-spill-id"
	// SpillHeaderNote is the engine's note on the message (see
	// consumer.Message.SpillNote); absent when it has none.
	SpillHeaderNote = "ringfence-spill-note"
	// SpillHeaderCount is how many of the record's headers, from the first,
	// are the original's, in decimal. It is the last header.
	SpillHeaderCount = "ringfence-spill-headers"
)

// spillRec is one message encoded for a spill topic, before it becomes a
// kafka-go Record (whose key and value readers can be sent only once).
type spillRec struct {
	key, value []byte
	headers    []kafkago.Header
	body       int // recordBody of the record
}

// encodeSpill encodes m for a spill topic, with tenant in SpillHeaderTenant
// when named (always in the shared topic; in an old per-tenant topic only
// for a hashed token).
func encodeSpill(m *consumer.Message, group, tenant string, named bool) spillRec {
	topic := m.Topic
	if topic == "" {
		topic = m.Partition.Topic
	}
	hs := make([]kafkago.Header, 0, len(m.Headers)+10)
	for _, h := range m.Headers {
		hs = append(hs, kafkago.Header{Key: h.Key, Value: h.Value})
	}
	part := strconv.FormatInt(int64(m.Partition.ID), 10)
	off := strconv.FormatInt(m.Offset, 10)
	hs = append(hs,
		kafkago.Header{Key: SpillHeaderSource, Value: []byte(topic)},
		kafkago.Header{Key: SpillHeaderPartition, Value: []byte(part)},
		kafkago.Header{Key: SpillHeaderOffset, Value: []byte(off)},
	)
	if t := m.Time; !t.IsZero() && t.Year() >= 0 && t.Year() <= 9999 {
		hs = append(hs, kafkago.Header{Key: SpillHeaderTime, Value: []byte(t.UTC().Format(time.RFC3339Nano))})
	}
	if m.Stream != "" {
		hs = append(hs, kafkago.Header{Key: SpillHeaderStream, Value: []byte(m.Stream)})
	}
	hs = append(hs, kafkago.Header{Key: SpillHeaderGroup, Value: []byte(group)})
	if named {
		hs = append(hs, kafkago.Header{Key: SpillHeaderTenant, Value: []byte(tenant)})
	}
	if note := m.SpillNote(); note != nil {
		hs = append(hs, kafkago.Header{Key: SpillHeaderNote, Value: note})
	}
	hs = append(hs,
		kafkago.Header{Key: SpillHeaderID, Value: []byte(topic + "/" + part + "/" + off)},
		kafkago.Header{Key: SpillHeaderCount, Value: []byte(strconv.Itoa(len(m.Headers)))},
	)
	return spillRec{key: m.Key, value: m.Value, headers: hs, body: recordBody(m.Key, m.Value, hs)}
}

// spilled is a spill record read back.
type spilled struct {
	msg    *consumer.Message
	group  string
	tenant string // SpillHeaderTenant; "" when absent
	named  bool   // SpillHeaderTenant is present
	id     string
}

// decodeSpill decodes a record of a spill topic read at f.offset; source is
// the SpillLog's source topic (the Partition's Topic). ok is false for a
// record that is not a spill record (a marker, or anything written by
// someone else). Key, value and the original's headers are f's own slices.
func decodeSpill(f *fetched, source string) (s spilled, ok bool) {
	hs := f.headers
	if len(hs) == 0 || hs[len(hs)-1].Key != SpillHeaderCount {
		return s, false
	}
	n, err := strconv.Atoi(string(hs[len(hs)-1].Value))
	if err != nil || n < 0 || n > len(hs)-1 {
		return s, false
	}
	m := &consumer.Message{}
	var havePart, haveOff bool
	var note []byte
	for _, h := range hs[n : len(hs)-1] {
		if !strings.HasPrefix(h.Key, SpillHeaderPrefix) {
			return s, false
		}
		v := string(h.Value)
		switch h.Key {
		case SpillHeaderSource:
			m.Topic = v
		case SpillHeaderPartition:
			p, err := strconv.ParseInt(v, 10, 32)
			if err != nil || p < 0 {
				return s, false
			}
			m.Partition.ID, havePart = int32(p), true
		case SpillHeaderOffset:
			o, err := strconv.ParseInt(v, 10, 64)
			if err != nil || o < 0 {
				return s, false
			}
			m.Offset, haveOff = o, true
		case SpillHeaderTime:
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return s, false
			}
			m.Time = t
		case SpillHeaderStream:
			m.Stream = v
		case SpillHeaderGroup:
			s.group = v
		case SpillHeaderTenant:
			s.tenant, s.named = v, true
		case SpillHeaderID:
			s.id = v
		case SpillHeaderNote:
			note = h.Value
		}
		// Other ringfence-spill- headers (a later version's) are ignored.
	}
	if m.Topic == "" || !havePart || !haveOff || s.group == "" {
		return s, false
	}
	m.Partition.Topic = source
	m.Key, m.Value = f.key, f.value
	if n > 0 {
		m.Headers = f.headers[:n:n]
	}
	m.Refed = true
	m.SpillPos = f.offset
	m.SetSpillNote(note)
	s.msg = m
	return s, true
}

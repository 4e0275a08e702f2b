package dlq

import "strconv"

// ID identifies a dead letter by the message it was made from: the source
// topic, partition and offset on Kafka, the stream and sequence on
// JetStream. A message that is delivered again (after a crash, a rebalance
// or an expired ack wait) and fails again is dead-lettered again under the
// same ID, so an ID may have several stored copies; inspectors show,
// count, replay and remove them as one. The zero ID is no ID.
type ID struct {
	// Kafka: the source topic, partition and offset.
	Topic     string
	Partition int32
	Offset    int64
	// JetStream: the stream and its sequence.
	Stream   string
	Sequence uint64
}

// ID returns the record's ID: (Stream, Sequence) when both are set, else
// (Source, Partition, Offset) when Source is set and Offset is not -1. ok
// is false when the record does not say where its message came from; such
// a record is a dead letter of its own.
func (r *Record) ID() (id ID, ok bool) {
	switch {
	case r.Stream != "" && r.Sequence != 0:
		return ID{Stream: r.Stream, Sequence: r.Sequence}, true
	case r.Source != "" && r.Offset >= 0:
		return ID{Topic: r.Source, Partition: r.Partition, Offset: r.Offset}, true
	}
	return ID{}, false
}

// String returns "<topic>/<partition>/<offset>" for a Kafka ID and
// "<stream>#<sequence>" for a JetStream one ("" for the zero ID). Kafka
// topic names contain neither '/' nor '#'.
func (id ID) String() string {
	switch {
	case id.Stream != "":
		return id.Stream + "#" + strconv.FormatUint(id.Sequence, 10)
	case id.Topic != "":
		return id.Topic + "/" + strconv.FormatInt(int64(id.Partition), 10) + "/" + strconv.FormatInt(id.Offset, 10)
	}
	return ""
}

// Collapse returns one record per dead letter of recs, which must be in
// DLQ order (oldest first): the first copy of each (Bucket, ID), in order
// of first appearance, with Copies listing every copy's Position and Time.
// A record without an ID is a dead letter of its own. recs is not
// modified; the result shares its keys, values and headers.
func Collapse(recs []Record) []Record {
	type key struct {
		bucket string
		id     ID
	}
	out := make([]Record, 0, len(recs))
	at := make(map[key]int, len(recs))
	for i := range recs {
		r := &recs[i]
		c := Copy{Position: r.Position, Time: r.Time}
		id, ok := r.ID()
		if ok {
			k := key{r.Bucket(), id}
			if j, seen := at[k]; seen {
				out[j].Copies = append(out[j].Copies, c)
				continue
			}
			at[k] = len(out)
		}
		rec := *r
		rec.Copies = []Copy{c}
		out = append(out, rec)
	}
	return out
}

package consumer

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/ringfence/ringfence/dlq"
)

// A spill note is what the engine knew against a message when it spilled
// it (see spillVerdict), carried by the spill log with the message so that a
// copy re-fed by another process (after a restart or a rebalance) keeps the
// verdict too. It is printable ASCII (base64url of a versioned binary form),
// at most MaxSpillNote bytes.
//
// Binary form: version, flags, then uvarints total, probeFails, dlqFails,
// judge span; varints backoff, first and last failure (Unix ns, 0 for none);
// then length-prefixed dlqReason, judge reason and last error text.

// MaxSpillNote is the longest spill note the engine writes (see
// Message.SpillNote); a SpillLog may refuse longer ones.
const MaxSpillNote = 1024

const (
	noteVersion = 1
	// maxNoteErr caps the last error's text in a note.
	maxNoteErr = 512
	// maxNoteCount bounds the counts a note may carry.
	maxNoteCount = 1 << 30

	noteEvidence = 1 << iota
	notePanicked
	noteErr
)

// errBadNote wraps every reason decodeNote refuses a note for.
var errBadNote = errors.New("consumer: bad spill note")

// noteError is a failure's error as a spill note carries it: its text.
type noteError string

func (e noteError) Error() string { return string(e) }

// encodeNote returns the spill note of v.
func encodeNote(v *spillVerdict) []byte {
	f := &v.fail
	var flags byte
	if f.evidence {
		flags |= noteEvidence
	}
	if f.panicked {
		flags |= notePanicked
	}
	var text string
	if f.lastErr != nil {
		flags |= noteErr
		text = truncUTF8(f.lastErr.Error(), maxNoteErr)
	}
	b := make([]byte, 0, 48+len(f.dlqReason)+len(v.judge)+len(text))
	b = append(b, noteVersion, flags)
	for _, n := range []int{f.total, f.probeFails, f.dlqFails, v.span} {
		b = binary.AppendUvarint(b, uint64(min(max(n, 0), maxNoteCount)))
	}
	b = binary.AppendVarint(b, int64(f.backoff))
	b = binary.AppendVarint(b, unixNano(f.first))
	b = binary.AppendVarint(b, unixNano(f.last))
	for _, s := range []string{string(f.dlqReason), string(v.judge), text} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return base64.RawURLEncoding.AppendEncode(nil, b)
}

// decodeNote parses a spill note into the verdict it carries (off left
// zero). Any note encodeNote did not write is refused with an error
// wrapping errBadNote.
func decodeNote(note []byte) (*spillVerdict, error) {
	if len(note) > MaxSpillNote {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", errBadNote, len(note), MaxSpillNote)
	}
	b, err := base64.RawURLEncoding.AppendDecode(nil, note)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadNote, err)
	}
	if len(b) < 2 || b[0] != noteVersion {
		return nil, fmt.Errorf("%w: not version %d", errBadNote, noteVersion)
	}
	flags := b[1]
	if flags&^(noteEvidence|notePanicked|noteErr) != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", errBadNote, flags)
	}
	r := noteReader{b: b[2:]}
	v := &spillVerdict{}
	f := &v.fail
	f.total, f.probeFails, f.dlqFails, v.span = r.count(), r.count(), r.count(), r.count()
	f.backoff = time.Duration(r.varint())
	f.first, f.last = fromUnixNano(r.varint()), fromUnixNano(r.varint())
	f.dlqReason, v.judge = dlq.Reason(r.str()), dlq.Reason(r.str())
	text := r.str()
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) > 0 {
		return nil, fmt.Errorf("%w: %d bytes after its end", errBadNote, len(r.b))
	}
	if !verdictReason(f.dlqReason) || !verdictReason(v.judge) {
		return nil, fmt.Errorf("%w: unknown reason %q or judge %q", errBadNote, f.dlqReason, v.judge)
	}
	if v.span > maxJudgeSpan || f.backoff < 0 {
		return nil, fmt.Errorf("%w: judge span %d or backoff %v out of range", errBadNote, v.span, f.backoff)
	}
	if f.dlqReason == "" && flags&noteEvidence == 0 {
		return nil, fmt.Errorf("%w: neither a dead-letter reason nor evidence", errBadNote)
	}
	if flags&noteErr != 0 {
		f.lastErr = noteError(text)
	} else if text != "" {
		return nil, fmt.Errorf("%w: error text without its flag", errBadNote)
	}
	f.evidence, f.panicked = flags&noteEvidence != 0, flags&notePanicked != 0
	return v, nil
}

// verdictReason reports whether r may stand in a note: none, or a reason
// the engine judges a message for.
func verdictReason(r dlq.Reason) bool {
	switch r {
	case "", dlq.ReasonPermanent, dlq.ReasonExhausted, dlq.ReasonPoison, dlq.ReasonPanic:
		return true
	}
	return false
}

// noteReader reads the fields of a note's binary form; the first error
// sticks, and every later read returns zero.
type noteReader struct {
	b   []byte
	err error
}

func (r *noteReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	n, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.err = fmt.Errorf("%w: truncated", errBadNote)
		return 0
	}
	r.b = r.b[k:]
	return n
}

// varint reads what binary.AppendVarint wrote: a zig-zag uvarint.
func (r *noteReader) varint() int64 {
	u := r.uvarint()
	n := int64(u >> 1)
	if u&1 != 0 {
		n = ^n
	}
	return n
}

func (r *noteReader) count() int {
	n := r.uvarint()
	if n > maxNoteCount && r.err == nil {
		r.err = fmt.Errorf("%w: count %d out of range", errBadNote, n)
	}
	return int(min(n, maxNoteCount))
}

func (r *noteReader) str() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("%w: truncated", errBadNote)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// truncUTF8 cuts s to at most n bytes, at a rune boundary.
func truncUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

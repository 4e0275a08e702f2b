package consumer

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ringfence/ringfence/dlq"
)

func TestSpillNoteRoundTrip(t *testing.T) {
	t.Parallel()
	first := time.Unix(1700000000, 123456789)
	for _, v := range []*spillVerdict{
		{judge: dlq.ReasonPoison, span: 3, fail: failState{total: 7, backoff: 250 * time.Millisecond, first: first, last: first.Add(time.Second),
			lastErr: errors.New("cannot be processed"), probeFails: 3, evidence: true, dlqReason: dlq.ReasonPoison, dlqFails: 12}},
		{fail: failState{total: 1, dlqReason: dlq.ReasonPermanent, lastErr: errors.New("bad ü " + strings.Repeat("é", 400))}},
		{fail: failState{panicked: true, dlqReason: dlq.ReasonPanic, total: 3}},
		{judge: dlq.ReasonPoison, span: maxJudgeSpan, fail: failState{evidence: true, total: 2}},
	} {
		note := encodeNote(v)
		if len(note) > MaxSpillNote {
			t.Fatalf("note of %d bytes, more than %d", len(note), MaxSpillNote)
		}
		for _, c := range note {
			if c < 0x21 || c > 0x7e {
				t.Fatalf("note %q is not printable ASCII", note)
			}
		}
		got, err := decodeNote(note)
		if err != nil {
			t.Fatalf("decode %q: %v", note, err)
		}
		w, g := v.fail, got.fail
		wantErr := ""
		if w.lastErr != nil {
			wantErr = truncUTF8(w.lastErr.Error(), maxNoteErr)
		}
		if got.judge != v.judge || got.span != v.span || g.total != w.total || g.backoff != w.backoff || !g.first.Equal(w.first) ||
			!g.last.Equal(w.last) || g.probeFails != w.probeFails || g.evidence != w.evidence || g.panicked != w.panicked ||
			g.dlqReason != w.dlqReason || g.dlqFails != w.dlqFails || (g.lastErr == nil) != (w.lastErr == nil) ||
			(g.lastErr != nil && g.lastErr.Error() != wantErr) {
			t.Fatalf("round trip of %+v gave %+v", v, got)
		}
	}
}

func TestSpillNoteRefusesForeignNotes(t *testing.T) {
	t.Parallel()
	good := encodeNote(&spillVerdict{fail: failState{dlqReason: dlq.ReasonExhausted, total: 3, lastErr: errors.New("x")}})
	for _, note := range [][]byte{
		[]byte("not base64!"),
		good[:len(good)-3],
		append(bytes.Clone(good), "AAAA"...),
		encodeNote(&spillVerdict{fail: failState{total: 3}}),                               // no verdict
		encodeNote(&spillVerdict{fail: failState{dlqReason: "made-up"}}),                   // unknown reason
		encodeNote(&spillVerdict{span: maxJudgeSpan + 1, fail: failState{evidence: true}}), // span out of range
		bytes.Repeat([]byte("A"), MaxSpillNote+4),
	} {
		if v, err := decodeNote(note); err == nil || !errors.Is(err, errBadNote) {
			t.Fatalf("decodeNote(%q) = %+v, %v; want an errBadNote", note, v, err)
		}
	}
}

// FuzzSpillNote: a note read from a spill log (outside input) never panics
// the decoder; one it accepts encodes back to a note that decodes the same.
func FuzzSpillNote(f *testing.F) {
	f.Add(encodeNote(&spillVerdict{judge: dlq.ReasonPoison, span: 2, fail: failState{evidence: true, total: 4, lastErr: errors.New("e")}}))
	f.Add(encodeNote(&spillVerdict{fail: failState{dlqReason: dlq.ReasonPanic, panicked: true, first: time.Unix(1, 2)}}))
	f.Add([]byte(""))
	f.Add([]byte("AQ"))
	f.Fuzz(func(t *testing.T, note []byte) {
		v, err := decodeNote(note)
		if err != nil {
			if v != nil || !errors.Is(err, errBadNote) {
				t.Fatalf("decodeNote(%q) = %+v, %v", note, v, err)
			}
			return
		}
		again, err := decodeNote(encodeNote(v))
		if err != nil {
			t.Fatalf("re-encoded note of %+v does not decode: %v", v, err)
		}
		if again.judge != v.judge || again.span != v.span || again.fail.dlqReason != v.fail.dlqReason || again.fail.total != v.fail.total ||
			again.fail.evidence != v.fail.evidence || again.fail.backoff != v.fail.backoff || !again.fail.last.Equal(v.fail.last) {
			t.Fatalf("re-encoded %+v decodes as %+v", v, again)
		}
	})
}

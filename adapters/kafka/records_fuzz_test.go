package kafka

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ringfence/ringfence/consumer"
)

// FuzzDecodeRecordBatches decodes arbitrary bytes (never a panic, offsets
// rising from the fetch offset) and, from the same input, builds
// well-formed batches with kmsg and checks that they decode to what was
// encoded.
func FuzzDecodeRecordBatches(f *testing.F) {
	for _, seed := range fuzzSeeds(f) {
		f.Add(seed, int64(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, from int64) {
		got, next, _ := decodeAll(data, from, 1<<20)
		last := from - 1
		for _, m := range got {
			if m.Offset <= last {
				t.Fatalf("offset %d after %d (from %d)", m.Offset, last, from)
			}
			last = m.Offset
		}
		if next < from || len(got) > 0 && next <= last {
			t.Fatalf("next offset %d (from %d, last delivered %d)", next, from, last)
		}

		bs := batchesFrom(data)
		var enc []byte
		var want []*consumer.Message
		start := from
		if len(bs) > 0 {
			start = bs[0].base + int64(len(data)%3) // sometimes inside the first batch
		}
		at := start
		for _, b := range bs {
			enc = b.encode(t, enc)
			w := b.want(at)
			want = append(want, w...)
			if len(w) > 0 {
				at = w[len(w)-1].Offset + 1
			}
		}
		got, next, err := decodeAll(enc, start, 0)
		if err != nil {
			t.Fatalf("well-formed batches: %v", err)
		}
		if err := sameMessages(got, want); err != nil {
			t.Fatalf("round trip: %v", err)
		}
		// Paused every few records and resumed from the reader's rest (a
		// fetcher the engine pauses mid-response): the same messages and
		// the same next offset.
		every := 1 + int(from&7)
		paused, pnext, err := decodePaused(enc, start, 0, every)
		if err != nil {
			t.Fatalf("well-formed batches, paused every %d: %v", every, err)
		}
		if err := sameMessages(paused, want); err != nil {
			t.Fatalf("paused every %d: %v", every, err)
		}
		if pnext != next {
			t.Fatalf("paused every %d: next offset %d, want %d", every, pnext, next)
		}
	})
}

// batchesFrom builds well-formed batches whose shape and contents come
// from data.
func batchesFrom(data []byte) []testBatch {
	take := func(n int) []byte {
		n = min(n, len(data))
		out := data[:n:n]
		data = data[n:]
		return out
	}
	num := func() int {
		if len(data) == 0 {
			return 0
		}
		return int(take(1)[0])
	}
	bytesOrNull := func() []byte {
		switch n := num(); {
		case n == 0:
			return nil
		case n == 1:
			return []byte{}
		default:
			return bytes.Clone(take(n % 40))
		}
	}
	var out []testBatch
	base := int64(num()) * 1000
	for len(data) > 0 && len(out) < 4 {
		b := testBatch{base: base, codec: codecs[num()%len(codecs)], lastDelta: -1, firstTime: int64(num()) << 30}
		flags := num()
		b.control, b.logAppendTime = flags&1 != 0, flags&2 != 0
		b.maxTime = b.firstTime + int64(flags)
		delta := int32(0)
		for range num()%6 + 1 {
			r := kmsg.Record{OffsetDelta: delta, TimestampDelta64: int64(num()) - 100, Key: bytesOrNull(), Value: bytesOrNull()}
			for range num() % 4 {
				r.Headers = append(r.Headers, kmsg.Header{Key: string(take(num() % 8)), Value: bytesOrNull()})
			}
			b.recs = append(b.recs, r)
			delta += int32(num()%3) + 1
		}
		if extra := num() % 3; extra > 0 {
			b.lastDelta = delta - 1 + int32(extra) // compacted away at the end
		}
		out = append(out, b)
		base += int64(max(b.lastDelta, delta)) + 1
	}
	return out
}

// fuzzSeeds are real batches: nulls and empties, every codec, control
// batches, LogAppendTime, a compacted batch, a truncated one, and bytes
// for batchesFrom.
func fuzzSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, codec := range codecs {
		data := testBatch{base: 10, codec: codec, lastDelta: -1, firstTime: 1000, recs: []kmsg.Record{
			rec(0, nil, nil), rec(1, []byte{}, []byte{}),
			rec(2, []byte("k"), []byte("v"), kmsg.Header{Key: "null"}, kmsg.Header{Key: "empty", Value: []byte{}}, kmsg.Header{Key: "t", Value: []byte("acme")}),
		}}.encode(t, nil)
		data = testBatch{base: 13, codec: codec, control: true, lastDelta: -1, recs: []kmsg.Record{rec(0, []byte{0, 0, 0, 0}, []byte{0, 0, 0, 0, 0, 0})}}.encode(t, data)
		data = testBatch{base: 14, codec: codec, logAppendTime: true, maxTime: 77, lastDelta: 5, recs: []kmsg.Record{rec(1, nil, []byte("x"))}}.encode(t, data)
		seeds = append(seeds, data, data[:len(data)-9])
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 4 {
		b := make([]byte, 200)
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		seeds = append(seeds, b)
	}
	return seeds
}

package wire

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire/wiretest"
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
		for _, r := range got {
			if r.Offset <= last {
				t.Fatalf("offset %d after %d (from %d)", r.Offset, last, from)
			}
			last = r.Offset
		}
		if next < from || len(got) > 0 && next <= last {
			t.Fatalf("next offset %d (from %d, last returned %d)", next, from, last)
		}

		bs := batchesFrom(data)
		var enc []byte
		start := from
		if len(bs) > 0 {
			start = bs[0].Base + int64(len(data)%3) // sometimes inside the first batch
		}
		for _, b := range bs {
			enc = b.Encode(t, enc)
		}
		want := wantAll(bs, start)
		got, next, err := decodeAll(enc, start, 0)
		if err != nil {
			t.Fatalf("well-formed batches: %v", err)
		}
		if err := sameRecords(got, want); err != nil {
			t.Fatalf("round trip: %v", err)
		}
		// Paused every few records and resumed from the reader's rest (a
		// fetcher paused mid-response): the same records and the same next
		// offset.
		every := 1 + int(from&7)
		paused, pnext, err := decodePaused(enc, start, 0, every)
		if err != nil {
			t.Fatalf("well-formed batches, paused every %d: %v", every, err)
		}
		if err := sameRecords(paused, want); err != nil {
			t.Fatalf("paused every %d: %v", every, err)
		}
		if pnext != next {
			t.Fatalf("paused every %d: next offset %d, want %d", every, pnext, next)
		}
	})
}

// batchesFrom builds well-formed batches whose shape and contents come
// from data.
func batchesFrom(data []byte) []batch {
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
	var out []batch
	base := int64(num()) * 1000
	for len(data) > 0 && len(out) < 4 {
		b := batch{Base: base, Codec: wiretest.Codecs[num()%len(wiretest.Codecs)], LastDelta: -1, FirstTime: int64(num()) << 30}
		flags := num()
		b.Control, b.LogAppendTime = flags&1 != 0, flags&2 != 0
		b.MaxTime = b.FirstTime + int64(flags)
		delta := int32(0)
		for range num()%6 + 1 {
			r := kmsg.Record{OffsetDelta: delta, TimestampDelta64: int64(num()) - 100, Key: bytesOrNull(), Value: bytesOrNull()}
			for range num() % 4 {
				r.Headers = append(r.Headers, kmsg.Header{Key: string(take(num() % 8)), Value: bytesOrNull()})
			}
			b.Recs = append(b.Recs, r)
			delta += int32(num()%3) + 1
		}
		if extra := num() % 3; extra > 0 {
			b.LastDelta = delta - 1 + int32(extra) // compacted away at the end
		}
		out = append(out, b)
		base += int64(max(b.LastDelta, delta)) + 1
	}
	return out
}

// fuzzSeeds are real batches: nulls and empties, every codec, control
// batches, LogAppendTime, a compacted batch, a truncated one, and bytes
// for batchesFrom.
func fuzzSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, codec := range wiretest.Codecs {
		data := batch{Base: 10, Codec: codec, LastDelta: -1, FirstTime: 1000, Recs: []kmsg.Record{
			rec(0, nil, nil), rec(1, []byte{}, []byte{}),
			rec(2, []byte("k"), []byte("v"), kmsg.Header{Key: "null"}, kmsg.Header{Key: "empty", Value: []byte{}}, kmsg.Header{Key: "t", Value: []byte("acme")}),
		}}.Encode(t, nil)
		data = batch{Base: 13, Codec: codec, Control: true, LastDelta: -1, Recs: []kmsg.Record{rec(0, []byte{0, 0, 0, 0}, []byte{0, 0, 0, 0, 0, 0})}}.Encode(t, data)
		data = batch{Base: 14, Codec: codec, LogAppendTime: true, MaxTime: 77, LastDelta: 5, Recs: []kmsg.Record{rec(1, nil, []byte("x"))}}.Encode(t, data)
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

package consumer

import (
	"math/rand/v2"
	"testing"
)

// TestWatermarkRandomSettleOrder is a property test: whatever order
// messages settle in, the commit point never passes an unsettled offset,
// never goes back, and reaches the end once everything is settled.
func TestWatermarkRandomSettleOrder(t *testing.T) {
	t.Parallel()
	for round := range 300 {
		r := rand.New(rand.NewPCG(uint64(round), 7))
		w := newWatermark()
		n := 1 + r.IntN(400)
		offsets := make([]int64, n)
		seqs := make([]uint64, n)
		off := int64(r.IntN(1000))
		for i := range n {
			off += 1 + int64(r.IntN(3)) // gaps, as compaction leaves
			offsets[i] = off
			seqs[i] = w.push(off)
		}
		settled := make([]bool, n)
		last := int64(-1)
		for _, i := range r.Perm(n) {
			settled[i] = true
			point, moved := w.settle(seqs[i])
			if !moved {
				continue
			}
			if point <= last {
				t.Fatalf("round %d: commit went from %d to %d", round, last, point)
			}
			last = point
			for j := range n {
				if offsets[j] < point && !settled[j] {
					t.Fatalf("round %d: commit %d exposes unsettled offset %d", round, point, offsets[j])
				}
			}
			// Settling twice changes nothing.
			if p2, moved2 := w.settle(seqs[i]); moved2 || p2 != point {
				t.Fatalf("round %d: double settle moved the watermark", round)
			}
		}
		if last != off+1 {
			t.Fatalf("round %d: final commit %d, want %d", round, last, off+1)
		}
		if w.pending() != 0 {
			t.Fatalf("round %d: %d pending after all settled", round, w.pending())
		}
	}
}

// TestWatermarkInterleaved pushes and settles interleaved, as a live
// partition does, and checks the same invariants with compaction at work.
func TestWatermarkInterleaved(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	w := newWatermark()
	type item struct {
		off int64
		seq uint64
	}
	var open []item
	settledUpTo := map[int64]bool{}
	var off int64
	last := int64(-1)
	for step := 0; step < 20000; step++ {
		if len(open) == 0 || r.IntN(3) > 0 {
			off++
			open = append(open, item{off, w.push(off)})
			continue
		}
		k := r.IntN(len(open))
		it := open[k]
		open = append(open[:k], open[k+1:]...)
		settledUpTo[it.off] = true
		point, moved := w.settle(it.seq)
		if moved {
			if point <= last {
				t.Fatalf("commit went back: %d -> %d", last, point)
			}
			last = point
			for _, o := range open {
				if o.off < point {
					t.Fatalf("commit %d exposes unsettled %d", point, o.off)
				}
			}
		}
	}
}

func BenchmarkWatermarkSettle(b *testing.B) {
	w := newWatermark()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s := w.push(int64(i))
		w.settle(s)
	}
}

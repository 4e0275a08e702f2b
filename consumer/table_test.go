package consumer

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestKeyTableAgainstMap runs random inserts, deletes and lookups on a
// keyTable and a Go map side by side: after every step both hold the same
// entries, every entry is found under its key, and no deleted key is.
// Few distinct keys and a small table make long probe runs that wrap
// around the end, where a backward shift is easy to get wrong.
func TestKeyTableAgainstMap(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var tab keyTable[*tenant]
		ref := map[string]*tenant{}
		hs := map[*tenant]uint64{} // the hash each value was put with
		keys := 8 + rng.IntN(200)
		for step := range 5000 {
			k := fmt.Sprint("k", rng.IntN(keys))
			h := keyHash(k)
			if rng.IntN(8) == 0 {
				h &= 7 // collide on purpose: the same home slot for many keys
			}
			if cur := ref[k]; cur != nil {
				if !tab.del(cur, hs[cur]) {
					t.Fatalf("seed %d step %d: %q not deleted", seed, step, k)
				}
				delete(ref, k)
				if tab.get(k, hs[cur]) != nil {
					t.Fatalf("seed %d step %d: %q found after its delete", seed, step, k)
				}
			} else {
				v := &tenant{key: k}
				hs[v] = h
				tab.put(v, h)
				ref[k] = v
			}
			if tab.len() != len(ref) {
				t.Fatalf("seed %d step %d: %d entries, want %d", seed, step, tab.len(), len(ref))
			}
			if step%97 == 0 || tab.len() < 8 {
				n := 0
				for v := range tab.all() {
					n++
					if ref[v.key] != v || tab.get(v.key, hs[v]) != v {
						t.Fatalf("seed %d step %d: entry %q not found under its key", seed, step, v.key)
					}
				}
				if n != len(ref) {
					t.Fatalf("seed %d step %d: all yields %d, want %d", seed, step, n, len(ref))
				}
			}
		}
		// A value that is not in the table is not deleted.
		if tab.del(&tenant{key: "k0"}, keyHash("k0")) {
			t.Fatalf("seed %d: deleted a value the table does not hold", seed)
		}
	}
}

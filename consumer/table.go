package consumer

import (
	"hash/maphash"
	"iter"
)

// keyTable is a hash table of tenants or lanes by their tenant key: the
// engine's tenant table (Consumer.tenants) and each partition's lanes
// (shard.lanes). It is an open-addressing table with linear probing whose
// slots hold the key's hash beside the value, so that
//
//   - a message's key is hashed once (keyHash) for both of its lookups,
//     the lane's and, on a lane's first sight, its tenant's;
//   - a lookup reads one slot line and then only the value whose hash
//     matches, which it reads anyway; a Go map reads its control word, the
//     slot's key and the key's bytes, three lines where each is a cache
//     miss once the tenants are many;
//   - a delete finds its slot by the value's identity, reading no key
//     (BenchmarkEngine at 100,000 tenants guards these).
//
// Deletes shift the following entries back (no tombstones), so a table
// that sees a stream of keys each inserted and deleted once stays as long
// as its largest count. Not safe for concurrent use: each table is guarded
// by its owner's lock.
type keyTable[T interface {
	comparable
	tableKey() string
}] struct {
	slots []tableSlot[T] // a power of two long, or empty
	n     int
}

type tableSlot[T comparable] struct {
	h uint64
	v T // the zero T: an empty slot
}

// tableMinSlots is a table's size on its first insert.
const tableMinSlots = 16

// keySeed seeds every table's hash: one seed for the process, so that a
// key's hash serves every table.
var keySeed = maphash.MakeSeed()

// keyHash is the hash of key in every keyTable.
func keyHash(key string) uint64 { return maphash.String(keySeed, key) }

func (t *tenant) tableKey() string { return t.key }
func (l *lane) tableKey() string   { return l.key }

// len is the number of entries.
func (m *keyTable[T]) len() int { return m.n }

// get returns the entry of key, whose hash is h, or the zero T.
func (m *keyTable[T]) get(key string, h uint64) T {
	var zero T
	if m.n == 0 {
		return zero
	}
	mask := uint64(len(m.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.v == zero {
			return zero
		}
		if s.h == h && s.v.tableKey() == key {
			return s.v
		}
	}
}

// byHash returns the first entry whose key's hash is h, or the zero T: the
// entry of a key of hash h, if present, most likely. It compares no key.
func (m *keyTable[T]) byHash(h uint64) T {
	var zero T
	if m.n == 0 {
		return zero
	}
	mask := uint64(len(m.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.v == zero || s.h == h {
			return s.v
		}
	}
}

// touch loads the home slot of a key of hash h.
func (m *keyTable[T]) touch(h uint64) byte {
	if len(m.slots) == 0 {
		return 0
	}
	return byte(m.slots[h&uint64(len(m.slots)-1)].h)
}

// put adds v, whose key's hash is h; its key must not be in the table.
func (m *keyTable[T]) put(v T, h uint64) {
	if (m.n+1)*4 > len(m.slots)*3 {
		m.grow()
	}
	var zero T
	mask := uint64(len(m.slots) - 1)
	i := h & mask
	for m.slots[i].v != zero {
		i = (i + 1) & mask
	}
	m.slots[i] = tableSlot[T]{h: h, v: v}
	m.n++
}

// grow doubles the slots (or makes the first ones) and files every entry
// again.
func (m *keyTable[T]) grow() {
	old := m.slots
	m.slots = make([]tableSlot[T], max(tableMinSlots, 2*len(old)))
	var zero T
	mask := uint64(len(m.slots) - 1)
	for _, s := range old {
		if s.v == zero {
			continue
		}
		i := s.h & mask
		for m.slots[i].v != zero {
			i = (i + 1) & mask
		}
		m.slots[i] = s
	}
}

// del removes v, whose key's hash is h, and reports whether it was there.
func (m *keyTable[T]) del(v T, h uint64) bool {
	var zero T
	if m.n == 0 {
		return false
	}
	mask := uint64(len(m.slots) - 1)
	i := h & mask
	for m.slots[i].v != v {
		if m.slots[i].v == zero {
			return false
		}
		i = (i + 1) & mask
	}
	// Shift back the entries after i that probed past it, so that every
	// entry stays reachable from its home slot with no empty slot between.
	for j := (i + 1) & mask; m.slots[j].v != zero; j = (j + 1) & mask {
		home := m.slots[j].h & mask
		// j's entry may move to i if its home is not in (i, j], cyclically.
		if (j-home)&mask >= (j-i)&mask {
			m.slots[i] = m.slots[j]
			i = j
		}
	}
	m.slots[i] = tableSlot[T]{}
	m.n--
	return true
}

// all yields every entry, in no particular order. The table must not
// change meanwhile.
func (m *keyTable[T]) all() iter.Seq[T] {
	return func(yield func(T) bool) {
		var zero T
		for i := range m.slots {
			if v := m.slots[i].v; v != zero && !yield(v) {
				return
			}
		}
	}
}

// reset removes every entry and frees the slots.
func (m *keyTable[T]) reset() { *m = keyTable[T]{} }

package kafka

import (
	"testing"

	"github.com/ringfence/ringfence/consumer"
)

func aheadMsgs(from int64, n int) []*consumer.Message {
	out := make([]*consumer.Message, n)
	for i := range out {
		out[i] = &consumer.Message{Value: make([]byte, 100), SpillPos: from + int64(i)}
	}
	return out
}

func TestReadAheadKeepsEntriesForTheNextRead(t *testing.T) {
	t.Parallel()
	p, q := consumer.Partition{Topic: "s"}, consumer.Partition{Topic: "s", ID: 1}
	a, b, c := consumer.SpillLane{Tenant: "a", Partition: p}, consumer.SpillLane{Tenant: "b", Partition: p}, consumer.SpillLane{Tenant: "c", Partition: q}
	one := entrySize(aheadMsgs(0, 1)[0])
	r := readAhead{max: 4*one + 3*aheadOverhead}

	r.put(a, 10, aheadMsgs(10, 3), 13)
	if got, _, ok := r.take(a, 10, 2); !ok || len(got) != 2 || got[0].SpillPos != 10 || got[1].SpillPos != 11 {
		t.Fatalf("take(a, 10, 2) = %d entries, %v", len(got), ok)
	}
	if r.kept() != one+aheadOverhead {
		t.Fatalf("kept %d bytes after taking 2 of 3, want %d", r.kept(), one+aheadOverhead)
	}
	if got, _, ok := r.take(a, 12, 5); !ok || len(got) != 1 || got[0].SpillPos != 12 {
		t.Fatalf("take(a, 12, 5) = %d entries, %v", len(got), ok)
	}
	if _, _, ok := r.take(a, 13, 5); ok || r.kept() != 0 {
		t.Fatalf("a lane read to its end still keeps something (%d bytes)", r.kept())
	}

	r.put(a, 20, aheadMsgs(20, 2), 22)
	if _, _, ok := r.take(a, 25, 1); ok {
		t.Fatal("take from another position served kept entries")
	}
	if _, _, ok := r.take(a, 20, 1); ok || r.kept() != 0 {
		t.Fatal("entries kept for a position the reader left are not dropped")
	}

	// Nothing of the lane in [30, 90): a Read at 30 fetches from 90.
	r.put(a, 30, nil, 90)
	if got, resume, ok := r.take(a, 30, 5); !ok || len(got) != 0 || resume != 90 {
		t.Fatalf("take(a, 30) = %d entries, resume %d, %v; want none and 90", len(got), resume, ok)
	}
	if _, _, ok := r.take(a, 30, 5); ok || r.kept() != 0 {
		t.Fatal("a used resume position is kept")
	}

	// The bound: the least recently used lane goes first.
	r.put(a, 0, aheadMsgs(0, 2), 2)
	r.put(b, 0, aheadMsgs(0, 2), 2)
	if _, _, ok := r.take(a, 0, 1); !ok { // a is now the most recently used
		t.Fatal("a's entries missing")
	}
	r.put(c, 0, aheadMsgs(0, 2), 2)
	if r.kept() > r.max {
		t.Fatalf("kept %d bytes, bound %d", r.kept(), r.max)
	}
	if _, _, ok := r.take(b, 0, 1); ok {
		t.Fatal("the least recently used lane was kept over the bound")
	}
	if _, _, ok := r.take(a, 1, 1); !ok {
		t.Fatal("the recently used lane was dropped")
	}
	r.put(b, 0, aheadMsgs(0, 5), 5) // alone over the bound
	if _, _, ok := r.take(b, 0, 1); ok {
		t.Fatal("entries over the bound by themselves were kept")
	}
	r.forget(q)
	if _, _, ok := r.take(c, 0, 1); ok {
		t.Fatal("forget(q) kept q's lane")
	}
	if r.kept() != 0 {
		t.Fatalf("kept %d bytes with nothing kept", r.kept())
	}
	off := readAhead{}
	off.put(a, 0, aheadMsgs(0, 1), 1)
	if _, _, ok := off.take(a, 0, 1); ok {
		t.Fatal("a read-ahead of 0 bytes kept something")
	}
}

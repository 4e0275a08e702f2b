package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"
)

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	want := `acme     handled 20 in order: true  dead-lettered 0
globex   handled 20 in order: true  dead-lettered 0
initech  handled 20 in order: true  dead-lettered 0
acme and initech finished while globex's API was down: true
`
	if got := out.String(); got != want {
		t.Fatalf("output:\n%s\nwant:\n%s", got, want)
	}
}

func TestInProduceOrder(t *testing.T) {
	seq := func(ns ...int) []handled {
		var hs []handled
		for _, n := range ns {
			hs = append(hs, handled{seq: uint64(100 + n), value: fmt.Sprintf("order-%d", n)})
		}
		return hs
	}
	all := make([]int, perTenant)
	for i := range all {
		all[i] = i + 1
	}
	swapped := append([]int{2, 1}, all[2:]...)
	for _, c := range []struct {
		name  string
		hs    []handled
		ahead map[uint64]bool
		want  bool
	}{
		{"in order", seq(all...), nil, true},
		{"two swapped", seq(swapped...), nil, false},
		{"the one ahead reported", seq(swapped...), map[uint64]bool{102: true}, true},
		{"another reported", seq(swapped...), map[uint64]bool{105: true}, false},
		{"one missing", seq(all[1:]...), nil, false},
		{"one twice", seq(append([]int{1}, all...)...), nil, false},
	} {
		if got := inProduceOrder(c.hs, c.ahead); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

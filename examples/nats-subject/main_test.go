package main

import (
	"bytes"
	"context"
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

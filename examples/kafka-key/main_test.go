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
	want := `acme     handled 10  dead-lettered 0
globex   handled 10  dead-lettered 0
initech  handled  9  dead-lettered 1
globex parked while its provider was down: true
DLQ orders.dlq.initech: 1 record(s), reason permanent: cannot parse order
`
	if got := out.String(); got != want {
		t.Fatalf("output:\n%s\nwant:\n%s", got, want)
	}
}

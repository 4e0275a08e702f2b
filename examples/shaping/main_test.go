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
	want := `acme    premium  deadline 1s     handled 2  dead-lettered 0
globex  standard deadline 100ms  handled 1  dead-lettered 1
        DLQ: monthly-report (exhausted: context deadline exceeded)
`
	if got := out.String(); got != want {
		t.Fatalf("output:\n%s\nwant:\n%s", got, want)
	}
}

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	var out, logs bytes.Buffer
	if err := run(context.Background(), &out, &logs); err != nil {
		t.Fatal(err)
	}
	want := `acme    quota  5/s  handled 15  dead-lettered 0
globex  quota 50/s  handled 15  dead-lettered 0
globex finished before acme: true
`
	if got := out.String(); got != want {
		t.Fatalf("output:\n%s\nwant:\n%s", got, want)
	}
	l := logs.String()
	for _, s := range []string{"tenant=acme event=admit-refused", "tenant=acme event=parked", "tenant=acme event=resumed"} {
		if !strings.Contains(l, s) {
			t.Errorf("logs lack %q", s)
		}
	}
	if strings.Contains(l, "tenant=globex event=admit-refused") {
		t.Error("globex, within its quota, was refused")
	}
}

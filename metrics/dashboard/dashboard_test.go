package dashboard_test

import (
	"bytes"
	"flag"
	"os"
	"testing"

	"github.com/ringfence/ringfence/metrics/dashboard"
)

var update = flag.Bool("update", false, "rewrite ringfence.json from Build")

// TestGoldenJSON keeps the committed ringfence.json equal to what Build
// produces (go generate rewrites it).
func TestGoldenJSON(t *testing.T) {
	got, err := dashboard.JSON()
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile("ringfence.json", got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("ringfence.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("ringfence.json differs from Build's dashboard; run `go generate ./metrics/dashboard` and commit the file")
	}
}

func TestEveryPanelHasAQuery(t *testing.T) {
	t.Parallel()
	qs, err := dashboard.Queries()
	if err != nil {
		t.Fatal(err)
	}
	d, err := dashboard.Build()
	if err != nil {
		t.Fatal(err)
	}
	panels := 0
	for _, p := range d.Panels {
		if p.Panel != nil {
			panels++
		}
	}
	if panels < 11 || len(qs) < panels {
		t.Fatalf("%d panels, %d queries", panels, len(qs))
	}
	for _, q := range qs {
		if q.Panel == "" || q.Expr == "" {
			t.Errorf("query without panel or expression: %+v", q)
		}
	}
}

package console_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
)

// pageTags renders the tenant view and a tenant's DLQ page for a tenant
// key, a value and a header, and counts the '<' in each: outside input is
// only ever text, so the count must not depend on it.
func pageTags(t *testing.T, key, value, hk, hv string) (int, int) {
	t.Helper()
	in := newMemInspector()
	in.add(key, value, dlq.Header{Key: hk, Value: []byte(hv)})
	eng := &countingEngine{stats: consumer.Stats{
		Tenants:    []consumer.TenantStats{{Tenant: key, State: policy.Open, Parked: 1}},
		Partitions: []consumer.PartitionStats{{Partition: consumer.Partition{Topic: "t"}, Unsettled: 1, OldestTenant: key}},
	}}
	c, err := console.New(console.Options{DLQ: in, Engine: eng, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	c.OnEvent(consumer.Event{Kind: consumer.EventParked, Tenant: key})
	get := func(path string) string {
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != 200 {
			t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	view := get("/")
	page := get("/dlq/" + dlq.TenantToken(key))
	return strings.Count(view, "<"), strings.Count(page, "<")
}

func FuzzPages(f *testing.F) {
	f.Add(hostile, `<img src=x onerror=alert(2)>`, "x-<b>", `"><script>alert(3)</script>`)
	f.Add("acme", "\x00\xff", "h", "v")
	f.Add(strings.Repeat("<a>", 100), strings.Repeat("é<", 3000), "</td>", "</pre>")
	f.Fuzz(func(t *testing.T, key, value, hk, hv string) {
		key = "t" + key // a non-empty key: the no-tenant bucket has its own page shape
		v0, p0 := pageTags(t, "tenant", "value", "h", "v")
		v, p := pageTags(t, key, value, hk, hv)
		if v != v0 || p != p0 {
			t.Fatalf("markup from outside input: %d/%d '<' in the tenant view and DLQ page, want %d/%d", v, p, v0, p0)
		}
	})
}

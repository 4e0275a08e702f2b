package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"

	rfkafka "github.com/ringfence/ringfence/adapters/kafka"
	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/internal/kafkatest"
	"github.com/ringfence/ringfence/internal/natstest"
)

func spillMsgs(p consumer.Partition, n int) []*consumer.Message {
	var out []*consumer.Message
	for i := range n {
		out = append(out, &consumer.Message{Value: []byte("v"), Topic: p.Topic, Partition: p, Offset: int64(i), Time: time.Now()})
	}
	return out
}

// spill ls lists what each tenant has waiting in its spill log, hostile
// keys included, and nothing for a tenant whose log was read and committed.
func TestSpillLs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	check := func(t *testing.T, base []string, want map[string]int64) {
		t.Helper()
		code, out, errs := cli(t, append([]string{"spill", "ls", "--json"}, base...)...)
		if code != 0 {
			t.Fatalf("spill ls exit %d: %s", code, errs)
		}
		got := map[string]int64{}
		for _, l := range jsonLines[spillLine](t, out, "spill") {
			got[rawTenant(l.Tenant)] = l.Records
		}
		if len(got) != len(want) {
			t.Fatalf("spill ls = %v, want %v", got, want)
		}
		for k, n := range want {
			if got[k] != n {
				t.Fatalf("spill ls = %v, want %v", got, want)
			}
		}
		code, out, _ = cli(t, append([]string{"spill", "ls"}, base...)...)
		if code != 0 || !strings.Contains(out, "acme") || !strings.Contains(out, "RECORDS") {
			t.Fatalf("table: exit %d\n%s", code, out)
		}
	}
	t.Run("kafka", func(t *testing.T) {
		c := kafkatest.MustStart(t, kfake.SeedTopics(2, "orders"))
		sl, err := rfkafka.NewSpillLog(c.Addrs(), "orders", "billing")
		if err != nil {
			t.Fatal(err)
		}
		defer sl.Close()
		p0, p1 := consumer.Partition{Topic: "orders", ID: 0}, consumer.Partition{Topic: "orders", ID: 1}
		for _, a := range []struct {
			tenant string
			p      consumer.Partition
			n      int
		}{{"acme", p0, 3}, {"acme", p1, 2}, {hostile, p0, 1}, {"done", p0, 2}} {
			if err := sl.Append(ctx, consumer.SpillLane{Tenant: a.tenant, Partition: a.p}, spillMsgs(a.p, a.n)); err != nil {
				t.Fatal(err)
			}
		}
		done := consumer.SpillLane{Tenant: "done", Partition: p0}
		ms, err := sl.Read(ctx, done, -1, 10)
		if err != nil || len(ms) != 2 {
			t.Fatalf("read %d, %v", len(ms), err)
		}
		if err := sl.Commit(ctx, done, ms[1].SpillPos+1); err != nil {
			t.Fatal(err)
		}
		base := []string{"--kafka", c.Addrs()[0], "--topic", "orders", "--group", "billing"}
		check(t, base, map[string]int64{"acme": 5, hostile: 1})
		// Every tenant waits in the one spill topic of the source.
		_, out, _ := cli(t, append([]string{"spill", "ls", "--json"}, base...)...)
		for _, l := range jsonLines[spillLine](t, out, "spill") {
			if l.Where != rfkafka.SpillTopic("orders") || rawTenant(l.Tenant) == "acme" && (l.Partitions["0"] != 3 || l.Partitions["1"] != 2) {
				t.Fatalf("spill ls line %+v; want %s, acme with 3 in partition 0 and 2 in 1", l, rfkafka.SpillTopic("orders"))
			}
		}
	})
	t.Run("nats", func(t *testing.T) {
		srv := natstest.Start(t)
		_, js := srv.JetStream(t)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
			t.Fatal(err)
		}
		base := []string{"--nats", srv.URL(), "--stream", "ORDERS", "--durable", "billing"}
		if code, _, errs := cli(t, append([]string{"spill", "ls"}, base...)...); code != 1 || !strings.Contains(errs, "no spill stream") {
			t.Fatalf("before any spill: exit %d, %q; want 1 and no spill stream", code, errs)
		}
		sl, err := rfnats.NewSpillLog(ctx, js, "ORDERS", "billing")
		if err != nil {
			t.Fatal(err)
		}
		p := consumer.Partition{Topic: "ORDERS/billing"}
		for _, a := range []struct {
			tenant string
			n      int
		}{{"acme", 3}, {hostile, 1}} {
			if err := sl.Append(ctx, consumer.SpillLane{Tenant: a.tenant, Partition: p}, spillMsgs(p, a.n)); err != nil {
				t.Fatal(err)
			}
		}
		check(t, base, map[string]int64{"acme": 3, hostile: 1})
	})
	t.Run("usage", func(t *testing.T) {
		for _, args := range [][]string{
			{"spill"}, {"spill", "ls"}, {"spill", "ls", "--kafka", "localhost", "--topic", "o", "--group", "g"},
			{"spill", "ls", "--kafka", "127.0.0.1:1", "--topic", "bad topic!", "--group", "g"},
			{"spill", "ls", "--nats", "nats://x:4222", "--stream", "S"},
		} {
			if code, _, _ := cli(t, args...); code != 2 {
				t.Errorf("%q: exit %d, want 2", args, code)
			}
		}
	})
}

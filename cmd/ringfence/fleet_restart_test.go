package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/fleet"
	"github.com/ringfence/ringfence/internal/natstest"
)

// A tenant held with the CLI stays held across a crash and restart of its
// process (the new agent loads the table before the engine's first
// message), while its partition-mate flows; released, its messages are
// all handled, in order, none lost.
func TestFleetHoldSurvivesRestart(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	base := []string{"--nats", srv.URL(), "--group", "shop"}
	if code, _, errs := cli(t, append([]string{"tenant", "hold", "vip", "--reason", "bad deploy"}, base...)...); code != 0 {
		t.Fatalf("hold: exit %d: %s", code, errs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := fleet.NewNATSStore(ctx, js, "shop", fleet.NATSOptions{Create: true, TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	b := consumertest.NewBroker("orders", 1)
	spill := consumertest.NewSpill()
	var want []string
	appendBoth := func(from, to int) {
		for i := from; i <= to; i++ {
			v := fmt.Sprint(i)
			b.Append(0, []byte("vip"), []byte(v))
			b.Append(0, []byte("other"), []byte(v))
			want = append(want, v)
		}
	}
	appendBoth(1, 5)
	p1 := startProcSpill(t, st, b, "p1", spill)
	consumertest.Eventually(t, "other's messages handled by p1", func() bool { return len(p1.h.of("other")) >= 5 })
	consumertest.Eventually(t, "p1 reporting vip held", func() bool {
		ts, ok := p1.c.Tenant("vip")
		return ok && ts.Held && ts.Control != nil && ts.Control.Hold
	})
	if got := p1.h.of("vip"); len(got) != 0 {
		t.Fatalf("held vip handled by p1: %v", got)
	}
	p1.stop()

	appendBoth(6, 8)
	p2 := startProcSpill(t, st, b, "p2", spill)
	consumertest.Eventually(t, "other's new messages handled by p2", func() bool { return slices.Contains(p2.h.of("other"), "8") })
	if got := p2.h.of("vip"); len(got) != 0 {
		t.Fatalf("held vip handled after the restart: %v", got)
	}
	// status shows vip held by p2, with its control; p1 is gone (Close
	// was not called: its status is there until its TTL, held too).
	consumertest.Eventually(t, "status showing vip held by p2", func() bool {
		code, out, _ := cli(t, append([]string{"status", "--json"}, base...)...)
		if code != 0 {
			return false
		}
		for _, line := range strings.Split(out, "\n") {
			if !strings.HasPrefix(line, `{"type":"tenant"`) {
				continue
			}
			l := jsonLines[console.FleetTenantLine](t, line, "tenant")[0]
			if l.Tenant.Key != "vip" || l.Control == nil || !l.Control.Control.Hold || l.Control.Reason != "bad deploy" {
				continue
			}
			for _, on := range l.On {
				if on.Process == "p2" && on.Held && on.Control != nil && on.Control.Hold {
					return true
				}
			}
		}
		return false
	})
	if code, _, errs := cli(t, append([]string{"tenant", "release", "vip", "--reason", "fixed"}, base...)...); code != 0 {
		t.Fatalf("release: exit %d: %s", code, errs)
	}
	consumertest.Eventually(t, "vip's messages handled after the release", func() bool { return len(p2.h.of("vip")) >= len(want) })
	if got := p2.h.of("vip"); !slices.Equal(got, want) {
		t.Fatalf("vip handled %v, want %v (all, in order, once)", got, want)
	}
	if r := b.Regressions(); len(r) > 0 {
		t.Fatalf("commit regressions: %v", r)
	}
}

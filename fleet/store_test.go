package fleet_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ringfence/ringfence/fleet"
	"github.com/ringfence/ringfence/internal/kafkatest"
	"github.com/ringfence/ringfence/internal/natstest"
)

// backend opens stores of one broker kind for a test, and makes foreign
// tables (not ringfence's) under a fleet table's name.
type backend struct {
	name    string
	open    func(t testing.TB, group string, create bool) (fleet.Store, error)
	foreign func(t testing.TB, group string, kind fleet.Kind)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func kafkaBackend(t testing.TB) backend {
	c := kafkatest.MustStart(t)
	return backend{
		name: "kafka",
		open: func(t testing.TB, group string, create bool) (fleet.Store, error) {
			s, err := fleet.NewKafkaStore(testCtx(t), c.Addrs(), group, fleet.KafkaOptions{Create: create})
			if err == nil {
				t.Cleanup(func() { s.Close() })
			}
			return s, err
		},
		foreign: func(t testing.TB, group string, kind fleet.Kind) {
			topic := fleet.KafkaTopic(group, kind)
			if err := c.Kfake().CreateTopic(topic, 1, map[string]string{"cleanup.policy": "compact"}); err != nil {
				t.Fatal(err)
			}
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := cl.ProduceSync(testCtx(t), &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("live data")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func natsBackend(t testing.TB) backend {
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	return backend{
		name: "nats",
		open: func(t testing.TB, group string, create bool) (fleet.Store, error) {
			return fleet.NewNATSStore(testCtx(t), js, group, fleet.NATSOptions{Create: create, TTL: 5 * time.Second})
		},
		foreign: func(t testing.TB, group string, kind fleet.Kind) {
			if _, err := js.CreateKeyValue(testCtx(t), jetstream.KeyValueConfig{Bucket: fleet.NATSBucket(group, kind)}); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func backends(t *testing.T) []func(testing.TB) backend {
	return []func(testing.TB) backend{kafkaBackend, natsBackend}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestStoreRoundTrip(t *testing.T) {
	t.Parallel()
	for _, mk := range backends(t) {
		b := mk(t)
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			if _, err := b.open(t, "g1", false); !errors.Is(err, fleet.ErrNoTable) {
				t.Fatalf("open without create: %v, want ErrNoTable", err)
			}
			st, err := b.open(t, "g1", true)
			if err != nil {
				t.Fatal(err)
			}
			// An empty table loads at once.
			if got, err := fleet.ReadControls(ctx, st, quiet()); err != nil || len(got) != 0 {
				t.Fatalf("empty control table: %v, %v", got, err)
			}
			at := time.Now().UTC().Truncate(time.Millisecond)
			for _, tenant := range []string{"acme", "a.b c", "\xff"} {
				if err := fleet.WriteControl(ctx, st, fleet.ControlRecord{Tenant: tenant, Control: fleet.Control{Hold: true}, By: "ops", At: at, Reason: "why"}); err != nil {
					t.Fatal(err)
				}
			}
			// A record that does not parse is skipped.
			if err := st.Put(ctx, fleet.KindControl, "junk", []byte("{not json")); err != nil {
				t.Fatal(err)
			}
			if err := fleet.WriteControl(ctx, st, fleet.ControlRecord{Tenant: "acme", By: "ops", At: at, Reason: "released"}); err != nil {
				t.Fatal(err)
			}
			got, err := fleet.ReadControls(ctx, st, quiet())
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 3 || got["acme"].Hold || got["acme"].Reason != "released" || !got["\xff"].Hold || !got["a.b c"].At.Equal(at) {
				t.Fatalf("controls: %+v", got)
			}
			// Statuses: a live one is read, an expired one is not, a
			// deleted one is gone.
			now := time.Now()
			for _, s := range []fleet.Status{
				{Process: "live", TTL: time.Minute, UpdatedAt: now},
				{Process: "dead", TTL: time.Second, UpdatedAt: now.Add(-time.Hour)},
				{Process: "gone", TTL: time.Minute, UpdatedAt: now},
			} {
				if err := fleet.PublishStatus(ctx, st, s); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.Delete(ctx, fleet.KindStatus, fleet.Key("gone")); err != nil {
				t.Fatal(err)
			}
			ss, err := fleet.ReadStatuses(ctx, st, now, quiet())
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := ss["live"]; len(ss) != 1 || !ok {
				t.Fatalf("statuses: %+v", ss)
			}
			// A second store of the same group opens the same tables.
			st2, err := b.open(t, "g1", true)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := fleet.ReadControls(ctx, st2, quiet()); err != nil || len(got) != 3 {
				t.Fatalf("second store: %v, %v", got, err)
			}
		})
	}
}

// A watch sees the table, then Loaded, then changes as they are written.
func TestStoreWatch(t *testing.T) {
	t.Parallel()
	for _, mk := range backends(t) {
		b := mk(t)
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			st, err := b.open(t, "gw", true)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Put(ctx, fleet.KindControl, "a", []byte("1")); err != nil {
				t.Fatal(err)
			}
			ch, err := st.Watch(ctx, fleet.KindControl)
			if err != nil {
				t.Fatal(err)
			}
			next := func() fleet.Update {
				t.Helper()
				select {
				case u := <-ch:
					if u.Err != nil {
						t.Fatal(u.Err)
					}
					return u
				case <-ctx.Done():
					t.Fatal("no update")
				}
				return fleet.Update{}
			}
			if u := next(); u.Key != "a" || string(u.Value) != "1" {
				t.Fatalf("first update %+v", u)
			}
			if u := next(); !u.Loaded {
				t.Fatalf("want Loaded, got %+v", u)
			}
			if err := st.Put(ctx, fleet.KindControl, "b", []byte("2")); err != nil {
				t.Fatal(err)
			}
			if u := next(); u.Key != "b" || string(u.Value) != "2" {
				t.Fatalf("change %+v", u)
			}
			if err := st.Delete(ctx, fleet.KindControl, "a"); err != nil {
				t.Fatal(err)
			}
			if u := next(); u.Key != "a" || u.Value != nil {
				t.Fatalf("delete %+v", u)
			}
		})
	}
}

// A topic or bucket under a fleet table's name that is not ringfence's is
// refused, for reading and writing.
func TestStoreRefusesForeignTables(t *testing.T) {
	t.Parallel()
	for _, mk := range backends(t) {
		b := mk(t)
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, kind := range []fleet.Kind{fleet.KindStatus, fleet.KindControl} {
				group := "foreign-" + kind.String()
				b.foreign(t, group, kind)
				for _, create := range []bool{kind == fleet.KindControl, true} {
					if _, err := b.open(t, group, create); !errors.Is(err, fleet.ErrNotFleet) {
						t.Fatalf("%s table, create=%v: %v, want ErrNotFleet", kind, create, err)
					}
				}
			}
		})
	}
}

package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ringfence/ringfence/adapters/kafka"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/fleet"
	"github.com/ringfence/ringfence/internal/kafkatest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// followOpen is how long a breaker stays open after its first trip in
// TestBreakerFollowsRebalance: the window in which the partition moves and
// the new owner's attempts are counted.
const followOpen = 5 * time.Second

var errDown = errors.New("the tenant's dependency is down")

// followRow is what one run of TestBreakerFollowsRebalance measured.
type followRow struct {
	name      string
	before    int           // the new owner's attempts of the tenant before the old owner's retry time
	first     time.Duration // from the owner's leaving to the new owner's first attempt of the tenant
	firstVsAt time.Duration // that first attempt's time minus the retry time
}

// A tenant's breaker follows it across a rebalance: three members of a
// Kafka consumer group (kafka.GroupSource on kfake) handle a topic of
// three partitions; tenant "sick" fails every call, so its breaker opens
// on the owner of its partition. The owner then leaves the group (its
// engine stops, then its agent closes) and another member gets the
// partition. Without agents the new owner learns the dependency is down
// from failures again: a failure threshold of attempts (with retries)
// before the old owner's retry time. With an agent beside each member, the
// new owner starts the tenant's breaker open until that time: at most one
// attempt before it (none, then a probe at it). The rows print with -v:
//
//	go test -run TestBreakerFollowsRebalance -v ./fleet/
func TestBreakerFollowsRebalance(t *testing.T) {
	if testing.Short() {
		t.Skip("moves a partition between members and waits for a breaker's open period")
	}
	t.Parallel()
	var mu sync.Mutex
	var rows []followRow
	t.Run("runs", func(t *testing.T) {
		for _, agents := range []bool{false, true} {
			name := "without agents"
			if agents {
				name = "with agents"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				r := followRebalance(t, agents)
				r.name = name
				mu.Lock()
				rows = append(rows, r)
				mu.Unlock()
				if agents && r.before > 1 {
					t.Errorf("with agents the new owner made %d attempts before the retry time, want at most 1", r.before)
				}
			})
		}
	})
	sort.Slice(rows, func(i, j int) bool { return rows[i].name > rows[j].name })
	s := "\n| run | new owner's attempts before retry-after | time to its first attempt | first attempt vs retry-after |\n|---|---|---|---|\n"
	for _, r := range rows {
		s += fmt.Sprintf("| %s | %d | %v | %+v |\n", r.name, r.before, r.first.Round(time.Millisecond), r.firstVsAt.Round(time.Millisecond))
	}
	t.Log(s)
}

// attempt is one call of the handler for the sick tenant.
type attempt struct {
	member int
	at     time.Time
}

type followMember struct {
	c      *consumer.Consumer
	agent  *fleet.Agent
	cancel context.CancelFunc
	done   chan error
}

func followRebalance(t *testing.T, agents bool) followRow {
	const (
		members = 3
		parts   = 3
		sick    = "sick"
		sickP   = 0
	)
	cl := kafkatest.MustStart(t, kfake.GroupMinSessionTimeout(500*time.Millisecond),
		kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0"}))
	addrs := cl.Addrs()
	topic, group := "orders", "g"
	if err := cl.Kfake().CreateTopic(topic, parts, nil); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)

	var mu sync.Mutex
	var attempts []attempt
	okBy := map[string]int{} // marker value -> member that handled it
	start := func(i int) *followMember {
		pol := policy.Default()
		pol.Breaker = &policy.Breaker{OpenTimeout: followOpen, MaxOpenTimeout: 4 * followOpen}
		c, err := consumer.New(consumer.Config{
			Scope:  scope.New(pol, scope.Options[string]{}),
			Tenant: consumer.FromKey(), DLQ: consumertest.NewSink(), Logger: quiet(),
			StuckAfter: time.Minute,
			Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
				mu.Lock()
				defer mu.Unlock()
				if string(m.Key) == sick {
					attempts = append(attempts, attempt{i, time.Now()})
					return errDown
				}
				okBy[string(m.Value)] = i
				return nil
			}),
		})
		if err != nil {
			t.Fatal(err)
		}
		fm := &followMember{c: c, done: make(chan error, 1)}
		if agents {
			st, err := fleet.NewKafkaStore(ctx, addrs, group, fleet.KafkaOptions{Create: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			fm.agent, err = fleet.NewAgent(fleet.AgentConfig{Consumer: c, Store: st, Group: group, Source: "kafka",
				Process: fmt.Sprintf("member-%d", i), Interval: 100 * time.Millisecond, TTL: 3 * time.Second, Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			if err := fm.agent.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
		src, err := kafka.NewGroupSource(addrs, topic, group,
			kafka.WithHeartbeatInterval(100*time.Millisecond), kafka.WithSessionTimeout(3*time.Second),
			kafka.WithRebalanceTimeout(3*time.Second), kafka.WithMaxWait(100*time.Millisecond),
			kafka.WithCommitInterval(50*time.Millisecond), kafka.WithLogger(quiet()))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(context.Background())
		fm.cancel = cancel
		go func() { fm.done <- c.Run(rctx, src) }()
		return fm
	}
	stop := func(fm *followMember) {
		if fm.cancel == nil {
			return
		}
		fm.cancel()
		fm.cancel = nil
		select {
		case err := <-fm.done:
			if err != nil {
				t.Errorf("member Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a member did not stop within 30s")
		}
		if fm.agent != nil {
			if err := fm.agent.Close(); err != nil {
				t.Errorf("agent Close: %v", err)
			}
		}
	}
	var ms []*followMember
	for i := range members {
		ms = append(ms, start(i))
	}
	defer func() {
		for _, fm := range ms {
			stop(fm)
		}
	}()

	prod, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produce := func(p int32, key, value string) {
		t.Helper()
		if err := prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Key: []byte(key), Value: []byte(value)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	owns := func(fm *followMember) []int32 {
		var ps []int32
		for _, p := range fm.c.Stats().Partitions {
			ps = append(ps, p.Partition.ID)
		}
		return ps
	}
	consumertest.Eventually(t, "one partition per member", func() bool {
		seen := map[int32]bool{}
		for _, fm := range ms {
			ps := owns(fm)
			if len(ps) != 1 || seen[ps[0]] {
				return false
			}
			seen[ps[0]] = true
		}
		return true
	})
	owner := -1
	for i, fm := range ms {
		if owns(fm)[0] == sickP {
			owner = i
		}
	}
	for i := range 10 {
		produce(sickP, sick, fmt.Sprint(i))
	}
	var g *policy.Guard
	consumertest.Eventually(t, "the tenant's breaker open on its owner", func() bool {
		var ok bool
		g, ok = ms[owner].c.Scope().Peek(sick)
		return ok && g.State() == policy.Open
	})
	retryAt := time.Now().Add(g.RetryAfter())
	if agents {
		consumertest.Eventually(t, "the other members' agents seeded", func() bool {
			for i, fm := range ms {
				if i != owner && fm.agent.Stats().Seeds == 0 {
					return false
				}
			}
			return true
		})
	}
	left := time.Now()
	stop(ms[owner])
	produce(sickP, "ok", "moved")
	consumertest.Eventually(t, "the partition handled by another member", func() bool {
		mu.Lock()
		defer mu.Unlock()
		by, ok := okBy["moved"]
		return ok && by != owner
	})
	mu.Lock()
	moved := okBy["moved"]
	mu.Unlock()
	// The new owner's first attempt at or after the retry time: with an
	// agent, its probe at that time; without, after its own open period.
	deadline := time.Now().Add(time.Until(retryAt) + 4*followOpen + time.Minute)
	for {
		mu.Lock()
		done := false
		for _, a := range attempts {
			if a.member != owner && !a.at.Before(retryAt) {
				done = true
			}
		}
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new owner made no attempt of the tenant at or after the retry time")
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	r := followRow{}
	var first time.Time
	for _, a := range attempts {
		if a.member == owner {
			continue
		}
		if a.member != moved {
			t.Errorf("member %d tried the tenant, the partition went to member %d", a.member, moved)
		}
		if first.IsZero() {
			first = a.at
		}
		if a.at.Before(retryAt) {
			r.before++
		}
	}
	r.first, r.firstVsAt = first.Sub(left), first.Sub(retryAt)
	if retryAt.Before(left) {
		t.Logf("the owner left after the retry time: nothing measured")
	}
	return r
}

package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ringfence/ringfence/adapters/kafka"
	rnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/fleet"
	"github.com/ringfence/ringfence/internal/kafkatest"
	"github.com/ringfence/ringfence/internal/natstest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// followOpen is how long a breaker stays open after its first trip in
// TestBreakerFollowsRebalance: the window in which the partition moves and
// the new owner's attempts are counted.
const followOpen = 5 * time.Second

// The tenants of TestBreakerFollowsRebalance: sick fails every call; a
// message of marker on sick's partition shows who owns it.
const (
	sick   = "sick"
	marker = "ok"
)

var errDown = errors.New("the tenant's dependency is down")

// followRow is what one run of TestBreakerFollowsRebalance measured.
type followRow struct {
	name      string
	before    int           // the new owner's attempts of the tenant before the old owner's retry time
	first     time.Duration // from the owner's leaving to the new owner's first attempt of the tenant
	firstVsAt time.Duration // that first attempt's time minus the retry time
}

// followEnv is one broker's group for TestBreakerFollowsRebalance.
type followEnv struct {
	members int
	tenant  consumer.TenantFunc
	source  func(t *testing.T, i int) consumer.Source
	store   func(t *testing.T) fleet.Store
	// produce writes a message of tenant (sick or marker) on sick's
	// partition.
	produce func(t *testing.T, tenant, value string)
	// ready waits until the group is settled, before sick has messages.
	ready func(t *testing.T, ms []*followMember)
}

// A tenant's breaker follows it across a rebalance. Kafka: three members
// of a consumer group (kafka.GroupSource on kfake) on three partitions.
// NATS: two instances of one member of a static partitioned consumer
// group (nats.WithConsumerGroup), one pinned, one standby. Tenant "sick"
// fails every call, so its breaker opens on the owner of its partition.
// The owner then leaves (its engine stops, then its agent closes) and
// another member (NATS: the standby) gets the partition. Without agents
// the new owner learns the dependency is down from failures again: a
// failure threshold of attempts (with retries) before the old owner's
// retry time. With an agent beside each member, the new owner starts the
// tenant's breaker open until that time: at most one attempt before it
// (none, then a probe at it). The rows print with -v:
//
//	go test -run TestBreakerFollowsRebalance -v ./fleet/
func TestBreakerFollowsRebalance(t *testing.T) {
	if testing.Short() {
		t.Skip("moves a partition between members and waits for a breaker's open period")
	}
	t.Parallel()
	envs := []struct {
		name string
		env  func(t *testing.T) followEnv
	}{{"kafka GroupSource, owner leaves", kafkaFollow}, {"nats consumer group, standby takes over", natsFollow}}
	var mu sync.Mutex
	var rows []followRow
	t.Run("runs", func(t *testing.T) {
		for _, e := range envs {
			for _, agents := range []bool{false, true} {
				name := e.name + ", without agents"
				if agents {
					name = e.name + ", with agents"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					r := followRebalance(t, e.env(t), agents)
					r.name = name
					mu.Lock()
					rows = append(rows, r)
					mu.Unlock()
					if agents && r.before > 1 {
						t.Errorf("with agents the new owner made %d attempts before the retry time, want at most 1", r.before)
					}
				})
			}
		}
	})
	sort.Slice(rows, func(i, j int) bool { return rows[i].name < rows[j].name })
	s := "\n| run | new owner's attempts before retry-after | time to its first attempt | first attempt vs retry-after |\n|---|---|---|---|\n"
	for _, r := range rows {
		s += fmt.Sprintf("| %s | %d | %v | %+v |\n", r.name, r.before, r.first.Round(time.Millisecond), r.firstVsAt.Round(time.Millisecond))
	}
	t.Log(s)
}

func kafkaFollow(t *testing.T) followEnv {
	const parts, sickP = 3, 0
	cl := kafkatest.MustStart(t, kfake.GroupMinSessionTimeout(500*time.Millisecond),
		kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0"}))
	addrs := cl.Addrs()
	const topic, group = "orders", "g"
	if err := cl.Kfake().CreateTopic(topic, parts, nil); err != nil {
		t.Fatal(err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	return followEnv{
		members: 3,
		tenant:  consumer.FromKey(),
		source: func(t *testing.T, i int) consumer.Source {
			src, err := kafka.NewGroupSource(addrs, topic, group,
				kafka.WithHeartbeatInterval(100*time.Millisecond), kafka.WithSessionTimeout(3*time.Second),
				kafka.WithRebalanceTimeout(3*time.Second), kafka.WithMaxWait(100*time.Millisecond),
				kafka.WithCommitInterval(50*time.Millisecond), kafka.WithLogger(quiet()))
			if err != nil {
				t.Fatal(err)
			}
			return src
		},
		store: func(t *testing.T) fleet.Store {
			st, err := fleet.NewKafkaStore(testCtx(t), addrs, group, fleet.KafkaOptions{Create: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		},
		produce: func(t *testing.T, tenant, value string) {
			if err := prod.ProduceSync(testCtx(t), &kgo.Record{Topic: topic, Partition: sickP, Key: []byte(tenant), Value: []byte(value)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		},
		ready: func(t *testing.T, ms []*followMember) {
			consumertest.Eventually(t, "one partition per member", func() bool {
				seen := map[int32]bool{}
				for _, fm := range ms {
					ps := fm.c.Stats().Partitions
					if len(ps) != 1 || seen[ps[0].Partition.ID] {
						return false
					}
					seen[ps[0].Partition.ID] = true
				}
				return true
			})
		},
	}
}

func natsFollow(t *testing.T) followEnv {
	srv := natstest.Start(t)
	_, js := srv.JetStream(t)
	const stream, subject, group = "ORDERS", "orders", "cg"
	tr, err := rnats.PartitionTransform(subject+".*", 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject + ".*"}, SubjectTransform: &tr}); err != nil {
		t.Fatal(err)
	}
	if err := rnats.CreateConsumerGroup(ctx, js, stream, group, "m1"); err != nil {
		t.Fatal(err)
	}
	return followEnv{
		members: 2,
		tenant:  rnats.FromSubjectToken(-1),
		source: func(t *testing.T, i int) consumer.Source {
			src, err := rnats.Open(testCtx(t), srv.Connect(t), stream, "", rnats.WithConsumerGroup(group, "m1"),
				rnats.WithGroupConsumerConfig(jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, MaxDeliver: -1}),
				rnats.WithLogger(quiet()))
			if err != nil {
				t.Fatal(err)
			}
			return src
		},
		store: func(t *testing.T) fleet.Store {
			_, js := srv.JetStream(t)
			st, err := fleet.NewNATSStore(testCtx(t), js, group, fleet.NATSOptions{Create: true, TTL: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
		produce: func(t *testing.T, tenant, value string) {
			if _, err := js.Publish(testCtx(t), subject+"."+tenant, []byte(value)); err != nil {
				t.Fatal(err)
			}
		},
		ready: func(*testing.T, []*followMember) {}, // the first message pins one instance
	}
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

func followRebalance(t *testing.T, env followEnv, agents bool) followRow {
	ctx := testCtx(t)
	var mu sync.Mutex
	var attempts []attempt
	markedBy := map[string]int{} // marker value -> member that handled it
	start := func(i int) *followMember {
		pol := policy.Default()
		pol.Breaker = &policy.Breaker{OpenTimeout: followOpen, MaxOpenTimeout: 4 * followOpen}
		c, err := consumer.New(consumer.Config{
			Scope:  scope.New(pol, scope.Options[string]{}),
			Tenant: env.tenant, DLQ: consumertest.NewSink(), Logger: quiet(),
			StuckAfter: time.Minute,
			Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
				tn, _ := env.tenant(m)
				mu.Lock()
				defer mu.Unlock()
				if tn == sick {
					attempts = append(attempts, attempt{i, time.Now()})
					return errDown
				}
				markedBy[string(m.Value)] = i
				return nil
			}),
		})
		if err != nil {
			t.Fatal(err)
		}
		fm := &followMember{c: c, done: make(chan error, 1)}
		if agents {
			fm.agent, err = fleet.NewAgent(fleet.AgentConfig{Consumer: c, Store: env.store(t), Group: "g",
				Process: fmt.Sprintf("member-%d", i), Interval: 100 * time.Millisecond, TTL: 3 * time.Second, Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			if err := fm.agent.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
		src := env.source(t, i)
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
	for i := range env.members {
		ms = append(ms, start(i))
	}
	defer func() {
		for _, fm := range ms {
			stop(fm)
		}
	}()
	env.ready(t, ms)

	for i := range 10 {
		env.produce(t, sick, fmt.Sprint(i))
	}
	owner := -1
	var g *policy.Guard
	consumertest.Eventually(t, "the tenant's breaker open on its owner", func() bool {
		for i, fm := range ms {
			if h, ok := fm.c.Scope().Peek(sick); ok && h.State() == policy.Open {
				owner, g = i, h
				return true
			}
		}
		return false
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
	env.produce(t, marker, "moved")
	consumertest.Eventually(t, "the partition handled by another member", func() bool {
		mu.Lock()
		defer mu.Unlock()
		by, ok := markedBy["moved"]
		return ok && by != owner
	})
	mu.Lock()
	moved := markedBy["moved"]
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

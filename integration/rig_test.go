package integration

// The rig every scenario shares: containers, child consumers, producer,
// reconcile. One concern (running a scenario), hence its length.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	kafkaad "github.com/ringfence/ringfence/adapters/kafka"
	natsad "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/brokertest"
)

// Bounds of every wait in the scenarios.
const (
	settleTimeout  = 150 * time.Second // all produced ids handled or dead-lettered
	produceTimeout = 60 * time.Second  // one produce batch, retried across outages
	stopTimeout    = 45 * time.Second  // a child draining after SIGTERM
)

// msg is one scenario message.
type msg struct {
	tenant, id string
	poison     bool
	at         time.Time // when the broker acknowledged it
}

// rig is one scenario's brokers, names, producer and consumer processes.
type rig struct {
	t      *testing.T
	kind   string // "kafka" or "nats"
	src    *brokertest.Broker
	dlq    *brokertest.Broker // the DLQ's broker; src unless separate
	topic  string             // Kafka topic or NATS stream
	group  string             // Kafka group or NATS durable
	dir    string
	hfile  string // handled file shared by every child
	base   childConfig
	kw     *kafka.Writer
	nc     *nats.Conn
	js     jetstream.JetStream
	nextID int

	mu       sync.Mutex
	produced map[string]msg // acknowledged by the broker; protected by mu
}

// newRig starts the brokers of a scenario: one, or two when the DLQ must be
// faulted apart from the source. The Kafka topic has 3 partitions.
func newRig(t *testing.T, kind string, separateDLQ bool) *rig {
	t.Helper()
	return newRigPartitions(t, kind, separateDLQ, 3)
}

// newRigPartitions is newRig with a Kafka topic of that many partitions.
func newRigPartitions(t *testing.T, kind string, separateDLQ bool, partitions int) *rig {
	t.Helper()
	r := &rig{t: t, kind: kind, dir: t.TempDir(), produced: map[string]msg{}}
	r.hfile = filepath.Join(r.dir, "handled.log")
	start := brokertest.StartKafka
	if kind == "nats" {
		start = brokertest.StartNATS
	}
	r.src = start(t)
	r.dlq = r.src
	if separateDLQ {
		r.dlq = start(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	switch kind {
	case "kafka":
		r.topic, r.group = "orders", "ringfence-it"
		r.createKafkaTopic(ctx, partitions)
		r.kw = &kafka.Writer{Addr: kafka.TCP(r.src.Addr), Topic: r.topic, Balancer: &kafka.Hash{},
			RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond, BatchSize: 200,
			WriteTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, MaxAttempts: 2}
		t.Cleanup(func() { r.kw.Close() })
		r.base = childConfig{Broker: kind, Addr: r.src.Addr, DLQAddr: r.dlq.Addr, Topic: r.topic, Group: r.group, Handled: r.hfile}
	case "nats":
		r.topic, r.group = "ORDERS", "ringfence-it"
		nc, err := nats.Connect(r.src.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		r.nc = nc
		r.js, _ = jetstream.New(nc)
		s, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: r.topic, Subjects: []string{"orders.>"}, Storage: jetstream.FileStorage})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: r.group, AckPolicy: jetstream.AckExplicitPolicy,
			AckWait: 5 * time.Second, MaxAckPending: 1000, MaxDeliver: -1}); err != nil {
			t.Fatal(err)
		}
		r.base = childConfig{Broker: kind, Addr: r.src.URL(), DLQAddr: r.dlq.URL(), Topic: r.topic, Group: r.group, Handled: r.hfile}
	}
	return r
}

func (r *rig) createKafkaTopic(ctx context.Context, partitions int) {
	r.t.Helper()
	err := brokertest.PollUntil(ctx, 30*time.Second, 200*time.Millisecond, func(ctx context.Context) error {
		conn, err := kafka.DialContext(ctx, "tcp", r.src.Addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		return conn.CreateTopics(kafka.TopicConfig{Topic: r.topic, NumPartitions: partitions, ReplicationFactor: 1})
	})
	if err != nil {
		r.t.Fatalf("create topic: %v", err)
	}
}

// messages returns n new messages per tenant, interleaved across tenants;
// poison marks which (tenant, index) are poison.
func (r *rig) messages(tenants []string, n int, poison func(tenant string, i int) bool) []msg {
	var out []msg
	for i := 0; i < n; i++ {
		for _, tn := range tenants {
			r.nextID++
			out = append(out, msg{tenant: tn, id: strconv.Itoa(r.nextID), poison: poison != nil && poison(tn, i)})
		}
	}
	return out
}

// produce writes msgs and returns once the broker acknowledged them, retrying
// (bounded) across broker outages.
func (r *rig) produce(msgs []msg) {
	r.t.Helper()
	if err := r.tryProduce(msgs); err != nil {
		r.t.Fatal(err)
	}
}

// tryProduce is produce for any goroutine.
func (r *rig) tryProduce(msgs []msg) error {
	ctx, cancel := context.WithTimeout(context.Background(), produceTimeout)
	defer cancel()
	var err error
	switch r.kind {
	case "kafka":
		km := make([]kafka.Message, len(msgs))
		for i, m := range msgs {
			km[i] = kafka.Message{Key: []byte(m.tenant), Value: payload(m.id, m.poison)}
		}
		err = brokertest.PollUntil(ctx, produceTimeout, 250*time.Millisecond, func(ctx context.Context) error {
			return r.kw.WriteMessages(ctx, km...)
		})
	case "nats":
		for _, m := range msgs {
			// Nats-Msg-Id makes a retried publish land once.
			err = brokertest.PollUntil(ctx, produceTimeout, 250*time.Millisecond, func(ctx context.Context) error {
				pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
				defer pcancel()
				_, err := r.js.Publish(pctx, "orders."+m.tenant, payload(m.id, m.poison), jetstream.WithMsgID(m.id))
				return err
			})
			if err != nil {
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("produce %d messages: %w", len(msgs), err)
	}
	at := time.Now()
	r.mu.Lock()
	for _, m := range msgs {
		m.at = at
		r.produced[m.id] = m
	}
	r.mu.Unlock()
	return nil
}

// produceInBackground produces batches of perTenant messages per tenant,
// every interval, and returns a channel that yields the first error (or nil)
// when done. Only this goroutine allocates ids meanwhile.
func (r *rig) produceInBackground(tenants []string, batches, perTenant int, interval time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; i < batches; i++ {
			if err := r.tryProduce(r.messages(tenants, perTenant, nil)); err != nil {
				done <- err
				return
			}
			<-tick.C
		}
		done <- nil
	}()
	return done
}

// producedCount is how many messages the broker acknowledged so far.
func (r *rig) producedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.produced)
}

// proc is a consumer child process.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startConsumer starts a consumer child process (this test binary, see
// TestMain) configured by cfg on top of the rig's names.
func (r *rig) startConsumer(name string, mod func(*childConfig)) *proc {
	r.t.Helper()
	cfg := r.base
	cfg.Name = name
	if mod != nil {
		mod(&cfg)
	}
	raw, _ := json.Marshal(cfg)
	p := &proc{name: name, log: filepath.Join(r.dir, name+".log"), done: make(chan struct{})}
	lf, err := os.Create(p.log)
	if err != nil {
		r.t.Fatal(err)
	}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	p.cmd.Stdout, p.cmd.Stderr = lf, lf
	if err := p.cmd.Start(); err != nil {
		lf.Close()
		r.t.Fatalf("start consumer %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	r.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		// A killed child never reaches the race detector's exit status:
		// its reports are found in its output instead.
		if out, _ := os.ReadFile(p.log); strings.Contains(string(out), "WARNING: DATA RACE") {
			r.t.Errorf("consumer %s: the race detector reported a data race (see its output)", name)
		}
		if r.t.Failed() {
			out, _ := os.ReadFile(p.log)
			if len(out) > 6000 {
				out = out[len(out)-6000:]
			}
			r.t.Logf("consumer %s output (tail):\n%s", name, out)
		}
	})
	return p
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s: %v", p.name, err)
	}
	<-p.done
}

// stop sends SIGTERM and waits (bounded) for a clean drain.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("consumer %s exited with %v", p.name, p.err)
		}
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Errorf("consumer %s did not drain within %v", p.name, stopTimeout)
	}
}

// handledLine is one record of the idempotent sink: the message's id and
// tenant, when and by which process it was handled, and where it came from
// in its source (partition and offset; a Kafka partition, or 0 for NATS
// with the stream sequence).
type handledLine struct {
	id, tenant, proc string
	at               time.Time
	partition        int32
	offset           int64
}

// handled reads the sink file.
func (r *rig) handled() []handledLine {
	r.t.Helper()
	f, err := os.Open(r.hfile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	var out []handledLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 6 {
			continue // a torn last line of a killed process
		}
		ns, _ := strconv.ParseInt(fs[2], 10, 64)
		part, _ := strconv.ParseInt(fs[4], 10, 32)
		off, _ := strconv.ParseInt(fs[5], 10, 64)
		out = append(out, handledLine{id: fs[0], tenant: fs[1], at: time.Unix(0, ns), proc: fs[3], partition: int32(part), offset: off})
	}
	return out
}

// deadLetters reads every record of every tenant's DLQ and returns how many
// times each message id is there.
func (r *rig) deadLetters(ctx context.Context) (map[string]int, error) {
	out := map[string]int{}
	err := r.eachDeadLetter(ctx, func(rec dlq.Record) {
		if id, _, ok := parsePayload(rec.Value); ok {
			out[id]++
		}
	})
	return out, err
}

// eachDeadLetter calls f with every record of every tenant's DLQ.
func (r *rig) eachDeadLetter(ctx context.Context, f func(dlq.Record)) error {
	var in dlq.Inspector
	switch r.kind {
	case "kafka":
		ki, err := kafkaad.NewDLQ([]string{r.dlq.Addr}, r.topic)
		if err != nil {
			return err
		}
		defer ki.Close()
		in = ki
	case "nats":
		nc, err := nats.Connect(r.dlq.URL(), nats.Timeout(3*time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		q, err := natsad.NewDLQ(ctx, js)
		if err != nil {
			return err
		}
		in = q
	}
	tenants, err := in.Tenants(ctx)
	if err != nil {
		return err
	}
	for _, ts := range tenants {
		recs, err := in.Peek(ctx, ts.Tenant, 0)
		if err != nil {
			return err
		}
		for _, rec := range recs {
			f(rec)
		}
	}
	return nil
}

// handledCount returns how many distinct produced ids were handled.
func (r *rig) handledCount() int {
	seen := map[string]bool{}
	for _, h := range r.handled() {
		seen[h.id] = true
	}
	return len(seen)
}

// waitHandled polls until at least n distinct ids were handled.
func (r *rig) waitHandled(n int, timeout time.Duration) {
	r.t.Helper()
	err := brokertest.PollUntil(context.Background(), timeout, 100*time.Millisecond, func(context.Context) error {
		if got := r.handledCount(); got < n {
			return fmt.Errorf("%d of %d handled", got, n)
		}
		return nil
	})
	if err != nil {
		r.t.Fatalf("waiting for handled messages: %v", err)
	}
}

// missing returns the produced ids neither handled nor dead-lettered.
func (r *rig) missing(ctx context.Context) ([]string, map[string]int, map[string]int, error) {
	hcount := map[string]int{}
	for _, h := range r.handled() {
		hcount[h.id]++
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var miss []string
	needDLQ := false
	for id := range r.produced {
		if hcount[id] == 0 {
			needDLQ = true
			break
		}
	}
	dcount := map[string]int{}
	if needDLQ {
		var err error
		if dcount, err = r.deadLetters(ctx); err != nil {
			return nil, hcount, nil, err
		}
	}
	for id := range r.produced {
		if hcount[id] == 0 && dcount[id] == 0 {
			miss = append(miss, id)
		}
	}
	sort.Strings(miss)
	return miss, hcount, dcount, nil
}

// waitSettled polls until every produced id is handled or dead-lettered.
func (r *rig) waitSettled() {
	r.t.Helper()
	err := brokertest.PollUntil(context.Background(), settleTimeout, 500*time.Millisecond, func(ctx context.Context) error {
		miss, _, _, err := r.missing(ctx)
		if err != nil {
			return err
		}
		if len(miss) > 0 {
			return fmt.Errorf("%d produced messages neither handled nor dead-lettered (first: %v)", len(miss), miss[:min(5, len(miss))])
		}
		return nil
	})
	if err != nil {
		r.t.Errorf("waiting for every message to settle: %v", err)
	}
}

// reconcileOutEnv names a file that reconcile lines are appended to, so a CI
// script can show them even though go test hides a passing test's output.
const reconcileOutEnv = "RINGFENCE_RECONCILE_OUT"

func appendReconcileOut(t *testing.T, line string) {
	path := os.Getenv(reconcileOutEnv)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Errorf("%s: %v", reconcileOutEnv, err)
		return
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		t.Errorf("%s: %v", reconcileOutEnv, err)
	}
}

// waitFor polls (bounded) until cond holds on the handled lines.
func (r *rig) waitFor(what string, timeout time.Duration, cond func([]handledLine) bool) {
	r.t.Helper()
	err := brokertest.PollUntil(context.Background(), timeout, 100*time.Millisecond, func(context.Context) error {
		if !cond(r.handled()) {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		r.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// result is a scenario's reconciliation.
type result struct {
	produced, handled, deadlettered, lost, duplicates int
	handledIDs, deadIDs                               map[string]int
}

// reconcile accounts for every produced id, prints the one reconcile line,
// and fails the test unless nothing was lost.
func (r *rig) reconcile(scenario string) result {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hcount := map[string]int{}
	for _, h := range r.handled() {
		hcount[h.id]++
	}
	dcount, err := r.deadLetters(ctx)
	if err != nil {
		r.t.Fatalf("read dead letters: %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	res := result{produced: len(r.produced), handledIDs: hcount, deadIDs: dcount}
	for id := range r.produced {
		h, d := hcount[id], dcount[id]
		switch {
		case h > 0:
			res.handled++
		case d > 0:
			res.deadlettered++
		default:
			res.lost++
		}
		// Every delivery past the first of an id: handled again, dead-lettered
		// again, or both handled and dead-lettered.
		if h+d > 1 {
			res.duplicates += h + d - 1
		}
	}
	line := fmt.Sprintf("reconcile: scenario=%s broker=%s produced=%d handled=%d deadlettered=%d lost=%d duplicates=%d",
		scenario, r.kind, res.produced, res.handled, res.deadlettered, res.lost, res.duplicates)
	fmt.Println(line)
	r.t.Log(line)
	appendReconcileOut(r.t, line)
	if res.lost != 0 {
		var lost []string
		for id, m := range r.produced {
			if hcount[id] == 0 && dcount[id] == 0 {
				lost = append(lost, m.tenant+"/"+id)
			}
		}
		sort.Strings(lost)
		r.t.Errorf("%s on %s lost %d messages (tenant/id): %v", scenario, r.kind, res.lost, lost[:min(20, len(lost))])
	}
	return res
}

// phaseLog returns a logger of a scenario's phases, each with the seconds
// since the call.
func phaseLog(t *testing.T) func(what string) {
	start := time.Now()
	return func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
}

package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/fleet"
	"github.com/ringfence/ringfence/internal/brokertest"
)

// Sizes and bounds of the fleet scenario. Every tenant produces one
// message a round; the run is bounded by fleetMaxRounds whatever happens.
const (
	fleetTenants     = 12
	fleetPartitions  = 6 // of the Kafka topic, and of the NATS consumer group
	fleetRoundEvery  = 50 * time.Millisecond
	fleetMaxRounds   = 3600
	fleetTries       = 20                     // holds (each followed by a release) measured
	fleetQuiet       = 400 * time.Millisecond // no handling of the held tenant for this long: it stopped
	fleetHeldFor     = 5 * time.Second        // traffic while held, once the new processes run
	fleetStepTimeout = 45 * time.Second       // one step: processes joining, a control applied, ...
	fleetHoldBound   = 10 * time.Second       // asserted on each hold's latency (the goal is 1s: printed)
	fleetCLITimeout  = 30 * time.Second       // one run of the CLI
)

// fleetRuns are the runs of the fleet scenario: a broker and its source.
var fleetRuns = []struct{ broker, source string }{
	{"kafka", "kgo"},
	{"nats", "pcgroup"},
}

// TestFleet runs three consumer processes, each with a fleet.Agent, over
// steady traffic of fleetTenants tenants, and drives them with the real
// ringfence binary: `status --json` shows the three processes and every
// partition's owner; `tenant hold` stops the held tenant in every process
// (latency measured over fleetTries holds, each released again); a hold
// survives SIGKILL of every process and a broker restart (none of the
// tenant's messages is handled until `tenant release`, then all are, in
// order); a killed process leaves `status` within its TTL.
func TestFleet(t *testing.T) {
	bin := buildRingfence(t)
	for _, run := range fleetRuns {
		t.Run(run.broker+"-"+run.source, func(t *testing.T) {
			fleetScenario(t, bin, run.broker, run.source)
		})
	}
}

// buildRingfence builds cmd/ringfence as a user would and returns the
// binary's path.
func buildRingfence(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ringfence")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/ringfence/ringfence/cmd/ringfence")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build cmd/ringfence: %v\n%s", err, out)
	}
	return bin
}

// ringfenceCLI runs the ringfence binary against one group.
type ringfenceCLI struct {
	t    *testing.T
	bin  string
	base []string // --kafka or --nats, --group
}

// run runs the binary (bounded) and returns its exit code and output.
func (c ringfenceCLI) run(args ...string) (code int, stdout, stderr string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), fleetCLITimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, append(args, c.base...)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		c.t.Fatalf("ringfence %v: %v", args, err)
	}
	return code, o.String(), e.String()
}

// must runs the binary and fails the test unless it exits 0.
func (c ringfenceCLI) must(args ...string) string {
	c.t.Helper()
	code, out, errs := c.run(args...)
	if code != 0 {
		c.t.Fatalf("ringfence %v: exit %d: %s", args, code, errs)
	}
	return out
}

// fleetStatus is `status --json` parsed.
type fleetStatus struct {
	raw        string
	processes  map[string]console.FleetProcessLine
	partitions map[string][]string // owners by partition
	tenants    map[string]console.FleetTenantLine
	controls   map[string]console.FleetControlLine
}

func (c ringfenceCLI) status() fleetStatus {
	c.t.Helper()
	out := c.must("status", "--json")
	s := fleetStatus{raw: out, processes: map[string]console.FleetProcessLine{}, partitions: map[string][]string{},
		tenants: map[string]console.FleetTenantLine{}, controls: map[string]console.FleetControlLine{}}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue // no live process and no control
		}
		var head struct{ Type string }
		if err := json.Unmarshal([]byte(line), &head); err != nil {
			c.t.Fatalf("status --json line %q: %v", line, err)
		}
		var err error
		switch head.Type {
		case "process":
			var l console.FleetProcessLine
			err = json.Unmarshal([]byte(line), &l)
			s.processes[l.Process] = l
		case "partition":
			var l console.FleetPartitionLine
			err = json.Unmarshal([]byte(line), &l)
			s.partitions[l.Partition] = l.Owners
		case "tenant":
			var l console.FleetTenantLine
			err = json.Unmarshal([]byte(line), &l)
			s.tenants[l.Tenant.Key] = l
		case "control":
			var l console.FleetControlLine
			err = json.Unmarshal([]byte(line), &l)
			if l.Tenant != nil {
				s.controls[l.Tenant.Key] = l
			}
		}
		if err != nil {
			c.t.Fatalf("status --json line %q: %v", line, err)
		}
	}
	return s
}

func (s fleetStatus) processNames() []string {
	var ps []string
	for p := range s.processes {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// handledTail reads the lines of one tenant that the children append to
// the handled file, from where it last stopped.
type handledTail struct {
	path, tenant string
	off          int64
}

func (h *handledTail) next(t *testing.T) []handledLine {
	t.Helper()
	f, err := os.Open(h.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(h.off, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	end := bytes.LastIndexByte(raw, '\n')
	if end < 0 {
		return nil
	}
	h.off += int64(end + 1)
	var out []handledLine
	sc := bufio.NewScanner(bytes.NewReader(raw[:end+1]))
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 6 || fs[1] != h.tenant {
			continue
		}
		ns, _ := strconv.ParseInt(fs[2], 10, 64)
		part, _ := strconv.ParseInt(fs[4], 10, 32)
		off, _ := strconv.ParseInt(fs[5], 10, 64)
		out = append(out, handledLine{id: fs[0], tenant: fs[1], at: time.Unix(0, ns), proc: fs[3], partition: int32(part), offset: off})
	}
	return out
}

// waitStopped polls (bounded) until the tenant has not been handled for
// fleetQuiet, and returns its last handling since from (from if none).
func (h *handledTail) waitStopped(t *testing.T, from time.Time) time.Time {
	t.Helper()
	last := from
	err := brokertest.PollUntil(context.Background(), fleetStepTimeout, 50*time.Millisecond, func(context.Context) error {
		for _, l := range h.next(t) {
			if l.at.After(last) {
				last = l.at
			}
		}
		if time.Since(last) < fleetQuiet {
			return fmt.Errorf("%s last handled %v ago", h.tenant, time.Since(last).Round(time.Millisecond))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("waiting for %s to stop: %v", h.tenant, err)
	}
	return last
}

// waitHandledAfter polls (bounded) until the tenant is handled after from,
// and returns when it first was.
func (h *handledTail) waitHandledAfter(t *testing.T, from time.Time) time.Time {
	t.Helper()
	var first time.Time
	err := brokertest.PollUntil(context.Background(), fleetStepTimeout, 20*time.Millisecond, func(context.Context) error {
		for _, l := range h.next(t) {
			if l.at.After(from) && (first.IsZero() || l.at.Before(first)) {
				first = l.at
			}
		}
		if first.IsZero() {
			return fmt.Errorf("%s not handled since %v", h.tenant, from.Format(time.StampMilli))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("waiting for %s to be handled: %v", h.tenant, err)
	}
	return first
}

// waitControlled polls (bounded) the group's statuses until exactly the
// processes procs report, each in a status written after since, that
// they apply n controls, and returns when they were seen so.
func waitControlled(t *testing.T, st fleet.Store, procs []string, n int, since time.Time) time.Time {
	t.Helper()
	err := brokertest.PollUntil(context.Background(), fleetStepTimeout, 50*time.Millisecond, func(ctx context.Context) error {
		ss, err := fleet.ReadStatuses(ctx, st, time.Now(), nil)
		if err != nil {
			return err
		}
		var got []string
		for _, s := range ss {
			if s.UpdatedAt.After(since) && s.Counts.Controlled == n {
				got = append(got, s.Process)
			}
		}
		slices.Sort(got)
		if len(ss) != len(procs) || !slices.Equal(got, procs) {
			return fmt.Errorf("%d statuses, those applying %d controls: %v (want %v)", len(ss), n, got, procs)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("waiting for the statuses: %v", err)
	}
	return time.Now()
}

func fleetScenario(t *testing.T, bin, kind, source string) {
	phase := phaseLog(t)
	report := func(line string) {
		fmt.Println(line)
		t.Log(line)
		appendReconcileOut(t, line)
	}
	r := newRigPartitions(t, kind, false, fleetPartitions)
	tenants := tenantNames(fleetTenants)
	held := tenants[0]
	events := filepath.Join(r.dir, "events.log")
	mod := func(c *childConfig) {
		c.Source = source
		c.WorkMs = 2
		c.Fleet = true
		c.Events, c.TraceDeliveries = events, true
		c.Member = strings.TrimSuffix(c.Name, "b") // c1b takes c1's place
	}
	names := []string{"c1", "c2", "c3"}
	if source == "pcgroup" {
		r.natsConsumerGroup(fleetPartitions, names...)
	}
	cli := ringfenceCLI{t: t, bin: bin, base: []string{"--" + kind, r.src.Addr, "--group", r.group}}
	if kind == "nats" {
		cli.base[1] = r.src.URL()
	}
	st := openFleetStore(t, r)

	stopProducing := make(chan struct{})
	prod := r.produceUntil(tenants, fleetMaxRounds, fleetRoundEvery, stopProducing)
	stopped := false
	defer func() {
		if !stopped {
			close(stopProducing)
		}
	}()
	procs := make([]*proc, len(names))
	for i, n := range names {
		procs[i] = r.startConsumer(n, mod)
	}

	// 1. status shows the three processes, each owning partitions, and
	// every partition's one owner.
	var s fleetStatus
	err := brokertest.PollUntil(context.Background(), fleetStepTimeout, 250*time.Millisecond, func(context.Context) error {
		s = cli.status()
		if got := s.processNames(); !slices.Equal(got, names) {
			return fmt.Errorf("processes %v", got)
		}
		if len(s.partitions) != fleetPartitions {
			return fmt.Errorf("%d partitions owned", len(s.partitions))
		}
		for p, o := range s.partitions {
			if len(o) != 1 {
				return fmt.Errorf("partition %s owned by %v", p, o)
			}
		}
		for _, p := range s.processes {
			if len(p.Partitions) == 0 {
				return fmt.Errorf("%s owns no partition yet", p.Process)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("status never showed %v owning %d partitions: %v\n%s", names, fleetPartitions, err, s.raw)
	}
	t.Logf("ringfence status --json:\n%s", s.raw)
	t.Logf("ringfence status:\n%s", cli.must("status"))
	r.waitCaughtUp(time.Second, fleetStepTimeout)
	phase(fmt.Sprintf("3 processes (source %s) in status, %d partitions owned, caught up", source, fleetPartitions))

	// 2. Hold latency: from the CLI's start to the held tenant's last
	// handling in any process; and to every status showing the control.
	tail := &handledTail{path: r.hfile, tenant: held}
	tail.waitHandledAfter(t, time.Now())
	var stopLat, appliedLat, cliLat, resumeLat []time.Duration
	for i := range fleetTries {
		from := time.Now()
		cli.must("tenant", "hold", held, "--reason", fmt.Sprintf("latency try %d", i), "--by", "integration")
		cliDone := time.Now()
		applied := waitControlled(t, st, names, 1, cliDone)
		last := tail.waitStopped(t, from)
		if d := last.Sub(from); d > fleetHoldBound {
			t.Errorf("hold %d: %s handled %v after the CLI started (bound %v)", i, held, d, fleetHoldBound)
		}
		stopLat, appliedLat, cliLat = append(stopLat, last.Sub(from)), append(appliedLat, applied.Sub(from)), append(cliLat, cliDone.Sub(from))
		rel := time.Now()
		cli.must("tenant", "release", held, "--reason", fmt.Sprintf("latency try %d done", i), "--by", "integration")
		resumeLat = append(resumeLat, tail.waitHandledAfter(t, rel).Sub(rel))
		waitControlled(t, st, names, 0, time.Now())
	}
	report(fmt.Sprintf("fleet: scenario=fleet broker=%s source=%s holds=%d stop(cli start to last handling) p50=%v p99=%v max=%v; all statuses show it p50=%v p99=%v; cli run p50=%v; release to first handling p50=%v p99=%v",
		kind, source, fleetTries, pct(stopLat, 0.5), pct(stopLat, 0.99), pct(stopLat, 1), pct(appliedLat, 0.5), pct(appliedLat, 0.99),
		pct(cliLat, 0.5), pct(resumeLat, 0.5), pct(resumeLat, 0.99)))
	phase("hold latency measured")

	// 3. A durable hold: every process killed, the broker restarted, new
	// processes started; the tenant stays held until released.
	const reason = "durable hold across kill and broker restart"
	from := time.Now()
	cli.must("tenant", "hold", held, "--reason", reason, "--by", "integration")
	waitControlled(t, st, names, 1, time.Now())
	tail.waitStopped(t, from)
	heldAt := time.Now()
	killed := map[string]time.Time{}
	for i, n := range names {
		procs[i].kill(t)
		killed[n] = time.Now()
	}
	restartFrom := time.Now()
	r.src.Restart(t)
	phase("held; every process killed, broker restarted")
	next := []string{"c1b", "c2b", "c3b"}
	for i, n := range next {
		procs[i] = r.startConsumer(n, mod)
	}
	waitControlled(t, st, next, 1, time.Now())
	r.waitFor("every new process handling", fleetStepTimeout, func(hs []handledLine) bool {
		c := map[string]int{}
		for _, h := range hs {
			c[h.proc]++
		}
		return c["c1b"] > 0 && c["c2b"] > 0 && c["c3b"] > 0
	})
	phase("3 new processes running, " + held + " still held")
	time.Sleep(fleetHeldFor) // traffic while held
	s = cli.status()
	ctl, ok := s.controls[held]
	if !ok || !ctl.Control.Hold || ctl.Reason != reason {
		t.Errorf("status after the restarts: control of %s %+v (present %v), want hold with reason %q\n%s", held, ctl, ok, reason, s.raw)
	}
	heldOn := 0
	if tl, ok := s.tenants[held]; ok {
		for _, o := range tl.On {
			if o.Held {
				heldOn++
			}
		}
	}
	if heldOn == 0 {
		t.Errorf("status after the restarts: no process reports %s held\n%s", held, s.raw)
	}
	t.Logf("ringfence status after the restarts:\n%s", cli.must("status"))
	rel := time.Now()
	var handledWhileHeld, producedWhileHeld int
	for _, h := range r.handled() {
		if h.tenant == held && h.at.After(heldAt) && h.at.Before(rel) {
			handledWhileHeld++
		}
	}
	r.mu.Lock()
	for _, m := range r.produced {
		if m.tenant == held && m.at.After(heldAt) {
			producedWhileHeld++
		}
	}
	r.mu.Unlock()
	if handledWhileHeld != 0 {
		t.Errorf("%d messages of %s handled while it was held", handledWhileHeld, held)
	}
	if producedWhileHeld == 0 {
		t.Errorf("no message of %s produced while it was held", held)
	}
	cli.must("tenant", "release", held, "--reason", "checked", "--by", "integration")
	resumed := tail.waitHandledAfter(t, rel)
	phase(fmt.Sprintf("released: %d of its messages produced while held, %d handled then; handled again %v after the release",
		producedWhileHeld, handledWhileHeld, resumed.Sub(rel).Round(time.Millisecond)))
	time.Sleep(time.Second) // traffic after the release
	close(stopProducing)
	stopped = true
	awaitProducer(t, prod)
	r.waitSettled()
	phase(fmt.Sprintf("settled with %d produced", r.producedCount()))

	hs := r.handled()
	ex := explanations(readEvents(t, events), killed, []time.Time{restartFrom})
	var heldHs []handledLine
	for _, h := range hs {
		if h.tenant == held {
			heldHs = append(heldHs, h)
		}
	}
	inv, invHeld := countInversions(hs, "tenant", ex), countInversions(heldHs, "tenant", ex)
	report(fmt.Sprintf("fleet: scenario=fleet broker=%s source=%s durable-hold produced-while-held=%d handled-while-held=%d inversions=%d (redelivered=%d reordered=%d unexplained=%d) of-held-tenant=%d (redelivered=%d)",
		kind, source, producedWhileHeld, handledWhileHeld, inv.total(), inv.redelivered, inv.reordered, len(inv.unexplained), invHeld.total(), invHeld.redelivered))
	// No handler fails here, so nothing is reordered on purpose: every
	// inversion must be a redelivery after a kill or the broker's restart.
	if inv.total() != inv.redelivered {
		t.Errorf("order inversions not explained by a redelivery: %d reordered, %d unexplained, e.g. %v",
			inv.reordered, len(inv.unexplained), inv.unexplained[:min(5, len(inv.unexplained))])
	}

	// 4. A killed process leaves status within its TTL: a reader drops a
	// status once its UpdatedAt plus its TTL is past, and the victim's last
	// heartbeat was sent before the kill. So no status read that starts a
	// TTL after the kill may list it; when it went is its last heartbeat
	// plus the TTL (a status call itself takes a while: the time the poll
	// saw it gone includes one).
	victim := procs[2]
	last := cli.status().processes[victim.name].UpdatedAt
	victim.kill(t)
	killedAt := time.Now()
	var sawGone time.Duration
	err = brokertest.PollUntil(context.Background(), fleetStepTimeout, 100*time.Millisecond, func(context.Context) error {
		start := time.Now()
		p, ok := cli.status().processes[victim.name]
		if !ok {
			sawGone = time.Since(killedAt)
			return nil
		}
		last = p.UpdatedAt
		if start.Sub(killedAt) >= fleetTTL {
			t.Errorf("a status read begun %v after the kill still lists %s (TTL %v, last heartbeat %v)",
				start.Sub(killedAt).Round(time.Millisecond), victim.name, fleetTTL, p.UpdatedAt)
		}
		return fmt.Errorf("%s still in status", victim.name)
	})
	if err != nil {
		t.Fatalf("killed process: %v", err)
	}
	if last.IsZero() || last.After(killedAt) {
		t.Errorf("%s's last heartbeat %v, killed at %v: want one before the kill", victim.name, last, killedAt)
	}
	report(fmt.Sprintf("fleet: scenario=fleet broker=%s source=%s killed process left status %v after the kill (its last heartbeat %v before it, plus TTL %v; heartbeat %v); the poll saw it gone after %v",
		kind, source, last.Add(fleetTTL).Sub(killedAt).Round(time.Millisecond), killedAt.Sub(last).Round(time.Millisecond), fleetTTL, fleetInterval, sawGone.Round(10*time.Millisecond)))
	for _, p := range procs[:2] {
		p.stop(t)
	}
	res := r.reconcile("fleet")
	if res.deadlettered != 0 {
		t.Errorf("%d messages dead-lettered; no handler failed", res.deadlettered)
	}
	phase("done")
}

// openFleetStore makes the rig's group's fleet tables before any process
// does, and returns them for the test to read.
func openFleetStore(t *testing.T, r *rig) fleet.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), fleetStepTimeout)
	defer cancel()
	var st fleet.Store
	var err error
	if r.kind == "kafka" {
		st, err = fleet.NewKafkaStore(ctx, []string{r.src.Addr}, r.group, fleet.KafkaOptions{Create: true})
	} else {
		var js jetstream.JetStream
		if js, err = jetstream.New(r.nc); err == nil {
			st, err = fleet.NewNATSStore(ctx, js, r.group, fleet.NATSOptions{Create: true, TTL: fleetTTL})
		}
	}
	if err != nil {
		t.Fatalf("fleet tables: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// pct returns the p-quantile of ds (nearest rank), rounded to the
// millisecond.
func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := int(float64(len(s))*p+0.999999) - 1
	return s[max(0, min(i, len(s)-1))].Round(time.Millisecond)
}

package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/brokertest"
)

// verdictStuckAfter is the consumers' StuckAfter in the verdict scenario:
// how long the poison message's refused dead letter holds its partition
// before its tenant spills.
const verdictStuckAfter = time.Second

// TestSpilledVerdictKill judges a poison message while its DLQ's broker is
// paused, so that its dead letter is refused and its tenant spills (the
// message holds its partition's commit past StuckAfter); kills the consumer
// process with SIGKILL once the source has committed past the message, so
// that only its spill record holds it; brings the DLQ back and starts
// another process. That process re-feeds the message from the spill log and
// dead-letters it on the verdict its spill record carries, without calling
// the handler again (a copy judged afresh would be called again: a poison
// message whose convicting evidence was handled long before would probe
// until its tenant's next message). Nothing is lost, and every other message
// of the poison tenant and of its partition-mates is handled.
func TestSpilledVerdictKill(t *testing.T) {
	for _, kind := range brokerKinds {
		t.Run(kind, func(t *testing.T) { spilledVerdictKill(t, kind) })
	}
}

func spilledVerdictKill(t *testing.T, kind string) {
	phase := phaseLog(t)
	r := newRig(t, kind, true)
	tenants := tenantNames(8)
	poisoned := crowdedTenant(kind, tenants, 3) // newRig's topic has 3 partitions
	events := filepath.Join(r.dir, "events.log")
	mod := func(name string) func(*childConfig) {
		return func(c *childConfig) {
			c.WorkMs = 1
			c.StuckAfterMs = int(verdictStuckAfter / time.Millisecond)
			c.Progress = filepath.Join(r.dir, name+".progress")
			c.Events = events
		}
	}
	c1 := r.startConsumer("c1", mod("c1"))
	r.produce(r.messages(tenants, 10, nil))
	r.waitHandled(len(tenants)*10, 60*time.Second)

	r.dlq.Pause(t)
	phase("DLQ paused")
	// The poison message first, then more of every tenant: the poison
	// tenant's wait behind its head, its partition-mates' are handled.
	poison := r.messages([]string{poisoned}, 1, func(string, int) bool { return true })
	r.produce(poison)
	r.produce(r.messages(tenants, 10, nil))

	// Judged (called) by c1, then spilled with its refused dead letter.
	var at place
	err := brokertest.PollUntil(context.Background(), spillPhaseTimeout, 50*time.Millisecond, func(context.Context) error {
		for _, e := range readEvents(t, events) {
			if e.kind == "poison-called" && e.proc == "c1" {
				at = place{e.partition, e.offset}
				return nil
			}
		}
		return fmt.Errorf("no call of the poison message yet")
	})
	if err != nil {
		t.Fatalf("waiting for c1 to call the poison message: %v", err)
	}
	c1.waitProgress(t, "c1 spilling the poison tenant", spillPhaseTimeout, func(p childProgress) bool {
		return p.Tenants[poisoned].Spilled > 0
	})
	phase(fmt.Sprintf("c1 spilled %s, whose poison message is at partition %d offset %d", poisoned, at.partition, at.offset))
	err = brokertest.PollUntil(context.Background(), spillPhaseTimeout, 100*time.Millisecond, func(ctx context.Context) error {
		return r.committedPast(ctx, at)
	})
	if err != nil {
		t.Fatalf("waiting for the source to commit past the spilled poison message: %v", err)
	}
	c1.kill(t)
	calls1 := r.countEvents(events, "poison-called", "", "c1")
	phase(fmt.Sprintf("c1 killed after %d calls of the poison message; the DLQ is back", calls1))
	r.dlq.Unpause(t)

	c2 := r.startConsumer("c2", mod("c2"))
	r.waitSettled()
	// The poison tenant alone spilled: c2's re-fed messages are its.
	c2.waitProgress(t, "c2 counting the messages it re-fed", spillPhaseTimeout, func(p childProgress) bool { return p.Refed > 0 })
	c2.stop(t)
	res := r.reconcile("spilled-verdict-kill")
	id := poison[0].id
	if res.deadIDs[id] == 0 || res.handledIDs[id] > 0 {
		t.Errorf("poison message %s: dead-lettered %d times, handled %d times; want in the DLQ only", id, res.deadIDs[id], res.handledIDs[id])
	}
	if res.deadlettered != 1 {
		t.Errorf("deadlettered=%d, want the poison message alone", res.deadlettered)
	}
	// Its record says what c1 judged: a permanent failure, on c1's call.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.eachDeadLetter(ctx, func(rec dlq.Record) {
		if got, _, _ := parsePayload(rec.Value); got == id && (rec.Reason != dlq.ReasonPermanent || rec.Attempts != calls1) {
			t.Errorf("poison message %s dead-lettered for %q after %d attempts, want %q after %d (c1's)", id, rec.Reason, rec.Attempts, dlq.ReasonPermanent, calls1)
		}
	})
	if err != nil {
		t.Fatalf("read dead letters: %v", err)
	}
	if calls2 := r.countEvents(events, "poison-called", "", "c2"); calls2 != 0 {
		t.Errorf("c2 called the re-fed poison message %d times: its verdict did not travel in its spill record", calls2)
	}
}

// committedPast returns nil once the consumer group has committed the
// message at m: on Kafka its committed offset is past m's, on NATS the
// durable's acknowledgement floor has reached m's stream sequence.
func (r *rig) committedPast(ctx context.Context, m place) error {
	switch r.kind {
	case "kafka":
		cl := &kafka.Client{Addr: kafka.TCP(r.src.Addr), Timeout: 5 * time.Second}
		resp, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: r.group, Topics: map[string][]int{r.topic: {int(m.partition)}}})
		if err != nil {
			return err
		}
		if resp.Error != nil {
			return resp.Error
		}
		for _, p := range resp.Topics[r.topic] {
			if p.Partition != int(m.partition) {
				continue
			}
			if p.Error != nil {
				return p.Error
			}
			if p.CommittedOffset <= m.offset {
				return fmt.Errorf("partition %d committed at %d, not past %d", m.partition, p.CommittedOffset, m.offset)
			}
			return nil
		}
		return fmt.Errorf("no committed offset of partition %d", m.partition)
	default:
		c, err := r.js.Consumer(ctx, r.topic, r.group)
		if err != nil {
			return err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if floor := int64(info.AckFloor.Stream); floor < m.offset {
			return fmt.Errorf("acknowledged up to %d, not %d", floor, m.offset)
		}
		return nil
	}
}

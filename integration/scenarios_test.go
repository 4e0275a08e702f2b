package integration

import (
	"fmt"
	"testing"
	"time"
)

var brokerKinds = []string{"kafka", "nats"}

func tenantNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("tenant-%d", i)
	}
	return out
}

// awaitProducer waits (bounded) for a background producer.
func awaitProducer(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * produceTimeout):
		t.Fatal("producer did not finish")
	}
}

// TestBrokerRestart stops and starts the broker container while a producer
// and a consumer are running; the broker keeps its data.
func TestBrokerRestart(t *testing.T) {
	for _, kind := range brokerKinds {
		t.Run(kind, func(t *testing.T) {
			r := newRig(t, kind, false)
			c := r.startConsumer("c1", func(c *childConfig) { c.WorkMs = 2 })
			prod := r.produceInBackground(tenantNames(6), 30, 5, 50*time.Millisecond) // 900 messages
			r.waitHandled(200, 60*time.Second)
			r.src.Restart(t)
			t.Logf("broker restarted with %d produced", r.producedCount())
			awaitProducer(t, prod)
			r.waitSettled()
			c.stop(t)
			r.reconcile("broker-restart")
		})
	}
}

// TestConsumerKill kills the consumer process with SIGKILL mid-run and
// starts a new one; what was unsettled is delivered again.
func TestConsumerKill(t *testing.T) {
	for _, kind := range brokerKinds {
		t.Run(kind, func(t *testing.T) {
			r := newRig(t, kind, false)
			r.produce(r.messages(tenantNames(6), 150, nil)) // 900 messages
			c1 := r.startConsumer("c1", func(c *childConfig) { c.WorkMs = 3 })
			r.waitHandled(300, 60*time.Second)
			c1.kill(t)
			t.Logf("consumer killed with %d handled", r.handledCount())
			r.produce(r.messages(tenantNames(6), 20, nil)) // arrives while no consumer runs
			c2 := r.startConsumer("c2", func(c *childConfig) { c.WorkMs = 3 })
			r.waitSettled()
			c2.stop(t)
			r.reconcile("consumer-kill")
		})
	}
}

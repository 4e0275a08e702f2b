package wire

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ringfence/ringfence/internal/kafkatest"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// produceValues writes values to partition 0 of topic.
func produceValues(t *testing.T, ctx context.Context, addrs []string, topic string, values ...string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, v := range values {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// fetchValues fetches topic/0 from offset once and returns the values.
func fetchValues(ctx context.Context, cl *Client, topic string, offset int64) ([]string, int64, error) {
	var out []string
	next, _, err := cl.Fetch(ctx, topic, 0, offset, FetchOptions{MaxBytes: 1 << 20, MaxWait: 10 * time.Millisecond}, func(r *Record, _ []Header) error {
		out = append(out, string(r.Value))
		return nil
	})
	return out, next, err
}

// A Client finds a partition's leader again when it moved, and a
// connection again when the broker closed the one it kept idle; a topic
// that does not exist is the cluster's answer.
func TestClientFollowsLeaderAndReconnects(t *testing.T) {
	t.Parallel()
	c := kafkatest.MustStart(t, kfake.NumBrokers(3), kfake.SeedTopics(1, "moving"))
	ctx := testCtx(t)
	cl := NewClient(kafkago.DefaultDialer, c.Addrs())
	defer cl.Close()
	produceValues(t, ctx, c.Addrs(), "moving", "a", "b")
	if got, next, err := fetchValues(ctx, cl, "moving", 0); err != nil || fmt.Sprint(got) != "[a b]" || next != 2 {
		t.Fatalf("fetch = %q, next %d, %v", got, next, err)
	}
	k := c.Kfake()
	if err := k.MoveTopicPartition("moving", 0, (k.LeaderFor("moving", 0)+1)%3); err != nil {
		t.Fatal(err)
	}
	produceValues(t, ctx, c.Addrs(), "moving", "c")
	if got, _, err := fetchValues(ctx, cl, "moving", 2); err != nil || fmt.Sprint(got) != "[c]" {
		t.Fatalf("fetch after the leader moved = %q, %v", got, err)
	}

	if err := c.Restart(); err != nil { // closes every connection; the topic comes back empty
		t.Fatal(err)
	}
	produceValues(t, ctx, c.Addrs(), "moving", "d")
	if got, _, err := fetchValues(ctx, cl, "moving", 0); err != nil || fmt.Sprint(got) != "[d]" {
		t.Fatalf("fetch after the broker restarted = %q, %v", got, err)
	}
	if _, _, err := fetchValues(ctx, cl, "never-made", 0); !errors.Is(err, kafkago.UnknownTopicOrPartition) {
		t.Fatalf("fetch of a topic that does not exist: %v, want UnknownTopicOrPartition", err)
	}
}

// Fetches from many goroutines share the Client's connections.
func TestClientConcurrentFetches(t *testing.T) {
	t.Parallel()
	c := kafkatest.MustStart(t, kfake.SeedTopics(1, "shared"))
	ctx := testCtx(t)
	produceValues(t, ctx, c.Addrs(), "shared", "a", "b", "c")
	cl := NewClient(kafkago.DefaultDialer, c.Addrs())
	defer cl.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			got, _, err := fetchValues(ctx, cl, "shared", int64(i%3))
			if err == nil && len(got) != 3-i%3 {
				err = fmt.Errorf("from %d: %q", i%3, got)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if n := len(cl.idle[c.Addrs()[0]]); n == 0 || n > idlePerBroker {
		t.Fatalf("%d idle connections kept, want 1 to %d", n, idlePerBroker)
	}
}

package kafka

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ringfence/ringfence/dlq"
)

// checkCopies checks how many stored copies each peeked dead letter lists.
func checkCopies(t *testing.T, recs []dlq.Record, want ...int) {
	t.Helper()
	for i, r := range recs {
		if len(r.Copies) != want[i] || r.Copies[0].Position != r.Position {
			t.Fatalf("dead letter %d (%q) lists copies %+v, want %d starting at its position %d", i, r.Value, r.Copies, want[i], r.Position)
		}
	}
}

// A record larger than its DLQ topic accepts, on a broker that refuses to
// raise the topic's limit, is ErrUnwritable; a DLQ that is down is not
// (issue 15 item 1: the engine sets the first aside and retries the second).
func TestSinkUnwritableOnlyWhenItCannotFit(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := testCtx(t, 60*time.Second)
	source := uniq("tight")
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	if err := createTopic(ctx, cl, source, 1, -1); err != nil {
		t.Fatal(err)
	}
	// An existing DLQ topic with a small limit, and a broker whose policy
	// refuses to change it.
	topic := dlq.KafkaTopic(source, "acme")
	if _, err := createTopicWith(ctx, cl, topic, 1, -1, kafkago.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: strconv.Itoa(4096)}); err != nil {
		t.Fatal(err)
	}
	c.Kfake().ControlKey(kmsg.IncrementalAlterConfigs.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.Kfake().KeepControl()
		r := req.(*kmsg.IncrementalAlterConfigsRequest)
		resp := r.ResponseKind().(*kmsg.IncrementalAlterConfigsResponse)
		for _, res := range r.Resources {
			rr := kmsg.NewIncrementalAlterConfigsResponseResource()
			rr.ResourceType, rr.ResourceName, rr.ErrorCode = res.ResourceType, res.ResourceName, kerr.PolicyViolation.Code
			resp.Resources = append(resp.Resources, rr)
		}
		return resp, nil, true
	})
	sink, err := NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	small := &dlq.Record{Tenant: "acme", Value: []byte("fits"), Source: source, Offset: 1, Reason: dlq.ReasonPermanent}
	if err := sink.Write(ctx, small); err != nil {
		t.Fatalf("a small record: %v", err)
	}
	big := &dlq.Record{Tenant: "acme", Value: make([]byte, 8192), Source: source, Offset: 2, Reason: dlq.ReasonPermanent}
	err = sink.Write(ctx, big)
	if !errors.Is(err, dlq.ErrUnwritable) {
		t.Fatalf("a record over a limit that may not be raised: %v, want ErrUnwritable", err)
	}
	t.Logf("unwritable: %v", err)

	c.Close()
	down, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err = sink.Write(down, &dlq.Record{Tenant: "globex", Value: []byte("x"), Source: source, Offset: 3, Reason: dlq.ReasonPermanent})
	if err == nil || errors.Is(err, dlq.ErrUnwritable) {
		t.Fatalf("a DLQ that is down: %v, want a transient error (not ErrUnwritable)", err)
	}
}

// A DLQ topic whose limit is below a record is raised to fit it.
func TestSinkRaisesItsTopicsLimit(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := testCtx(t, 60*time.Second)
	source := uniq("raise")
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	if err := createTopic(ctx, cl, source, 1, -1); err != nil {
		t.Fatal(err)
	}
	topic := dlq.KafkaTopic(source, "acme")
	if _, err := createTopicWith(ctx, cl, topic, 1, -1, kafkago.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "4096"}); err != nil {
		t.Fatal(err)
	}
	sink, err := NewSink(c.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if err := sink.Write(ctx, &dlq.Record{Tenant: "acme", Value: make([]byte, 8192), Source: source, Offset: 1, Reason: dlq.ReasonPermanent}); err != nil {
		t.Fatalf("a record over its topic's limit: %v", err)
	}
	if n, err := topicLimit(ctx, cl, topic); err != nil || n <= 8192 {
		t.Fatalf("topic limit after the write = %d, %v", n, err)
	}
}

// A MarkerMoved record read from a DLQ decodes to IDs without blank ones,
// whatever its bytes.
func FuzzMovedLetters(f *testing.F) {
	f.Add("acme", []byte("orders/0/41\norders/1/7"))
	f.Add("", []byte("\n\n@0/3\n"))
	f.Fuzz(func(t *testing.T, token string, value []byte) {
		hs := []dlq.Header{{Key: dlq.HeaderMarker, Value: []byte(dlq.MarkerMoved)}, {Key: dlq.HeaderTenantToken, Value: []byte(token)}}
		for _, l := range movedLetters(hs, value) {
			if l.id == "" || strings.Contains(l.id, "\n") || l.token != token {
				t.Fatalf("letter %+v from %q", l, value)
			}
		}
	})
}

package nats

import (
	"context"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/internal/cputime"
	"github.com/ringfence/ringfence/internal/natstest"
)

// The comparison with nats.go's Consume (BenchmarkConsume) is in the bench
// module, bench/nats.

// BenchmarkSpillLog measures the spill log on an in-process server with
// 128-byte messages of one tenant: appends in the engine's batches of 256
// (atomic batches, and one record at a time as on servers without them),
// and the re-feed: reads of the engine's window of 64, each followed by
// the commit that purges what was read. ns/op is per message.
//
//	go test -run '^$' -bench BenchmarkSpillLog -benchtime 50000x ./adapters/nats
func BenchmarkSpillLog(b *testing.B) {
	srv := natstest.Start(b)
	payload := make([]byte, 128)
	msgs := func(f *fixture, from, n int) []*consumer.Message {
		p := homePartition(f.stream, f.durable)
		out := make([]*consumer.Message, n)
		for i := range out {
			out[i] = &consumer.Message{Value: payload, Topic: f.subject + ".acme", Stream: f.stream, Partition: p, Offset: int64(from + i + 1), Time: time.Now()}
		}
		return out
	}
	appendAll := func(b *testing.B, s *SpillLog, f *fixture, lane consumer.SpillLane) {
		for i := 0; i < b.N; i += 256 {
			if err := s.Append(context.Background(), lane, msgs(f, i, min(256, b.N-i))); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, mode := range []struct {
		name   string
		atomic bool
	}{{"append-atomic-batch", true}, {"append-one-at-a-time", false}} {
		b.Run(mode.name, func(b *testing.B) {
			f := newFixture(b, srv, 30*time.Second, 1000)
			s := f.spillLog(b)
			s.atomic = mode.atomic
			lane := consumer.SpillLane{Tenant: "acme", Partition: homePartition(f.stream, f.durable)}
			b.ReportAllocs()
			b.ResetTimer()
			appendAll(b, s, f, lane)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(cputime.RoundTrip(5, 20000)), "xcore-ns")
		})
	}
	b.Run("refeed-64", func(b *testing.B) {
		f := newFixture(b, srv, 30*time.Second, 1000)
		s := f.spillLog(b)
		lane := consumer.SpillLane{Tenant: "acme", Partition: homePartition(f.stream, f.durable)}
		appendAll(b, s, f, lane)
		b.ReportAllocs()
		b.ResetTimer()
		ctx := context.Background()
		read, from := 0, int64(-1)
		for read < b.N {
			ms, err := s.Read(ctx, lane, from, 64)
			if err != nil {
				b.Fatal(err)
			}
			if len(ms) == 0 {
				b.Fatalf("read %d of %d", read, b.N)
			}
			read += len(ms)
			from = ms[len(ms)-1].SpillPos + 1
			if err := s.Commit(ctx, lane, from); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		b.ReportMetric(float64(cputime.RoundTrip(5, 20000)), "xcore-ns")
	})
}

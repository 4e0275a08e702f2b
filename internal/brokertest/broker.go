package brokertest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"
	"github.com/testcontainers/testcontainers-go"

	"github.com/ringfence/ringfence/internal/brokerimage"
)

// Timeouts for container operations; every wait is bounded.
const (
	startTimeout = 90 * time.Second
	stopTimeout  = 10 * time.Second // SIGTERM grace before SIGKILL
)

// Broker is one broker container. Its methods end the test on error. A
// Broker is safe for concurrent use, but faults (Stop, Pause, ...) are meant
// to be driven from one goroutine.
type Broker struct {
	// Kind is "kafka" or "nats".
	Kind string
	// Addr is the host:port clients dial (127.0.0.1:P), stable across Stop
	// and Start.
	Addr string
	// Image is the image the container runs.
	Image brokerimage.Image

	cli   client.APIClient
	c     testcontainers.Container
	ready func(context.Context) error

	mu     sync.Mutex
	paused bool // protected by mu
}

// URL is the NATS URL of a NATS broker (nats://Addr).
func (b *Broker) URL() string { return "nats://" + b.Addr }

// ContainerID is the Docker id of the container.
func (b *Broker) ContainerID() string { return b.c.GetContainerID() }

// StartKafka starts a one-broker Kafka in a container and waits until it
// answers metadata requests. Topics are auto-created with 3 partitions.
func StartKafka(t testing.TB) *Broker {
	t.Helper()
	cli := RequireDocker(t)
	img := image(t, cli, brokerimage.Kafka)
	port := FreePort(t)
	addr := "127.0.0.1:" + itoa(port)
	env := map[string]string{
		"KFAKE_ADVERTISE":  addr,
		"KFAKE_DATA_DIR":   "/data",
		"KFAKE_PARTITIONS": "3",
	}
	if img.Override {
		env = officialKafkaEnv(addr)
	}
	b := &Broker{Kind: "kafka", Addr: addr, Image: img, cli: cli}
	b.ready = func(ctx context.Context) error { return kafkaReady(ctx, addr) }
	b.start(t, testcontainers.ContainerRequest{Image: img.Ref, Env: env}, "9092/tcp", port)
	return b
}

// officialKafkaEnv configures the apache/kafka image (KRaft, one node) to
// advertise addr. Used only with RINGFENCE_KAFKA_IMAGE.
func officialKafkaEnv(addr string) map[string]string {
	return map[string]string{
		"KAFKA_NODE_ID":                                  "1",
		"KAFKA_PROCESS_ROLES":                            "broker,controller",
		"KAFKA_LISTENERS":                                "PLAINTEXT://:9092,CONTROLLER://:9093",
		"KAFKA_ADVERTISED_LISTENERS":                     "PLAINTEXT://" + addr,
		"KAFKA_CONTROLLER_LISTENER_NAMES":                "CONTROLLER",
		"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":           "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
		"KAFKA_CONTROLLER_QUORUM_VOTERS":                 "1@localhost:9093",
		"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":         "1",
		"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
		"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":            "1",
		"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":         "0",
		"KAFKA_NUM_PARTITIONS":                           "3",
		"KAFKA_AUTO_CREATE_TOPICS_ENABLE":                "true",
	}
}

// StartNATS starts a NATS server with JetStream (file store in /data) in a
// container and waits until JetStream answers.
func StartNATS(t testing.TB) *Broker {
	t.Helper()
	cli := RequireDocker(t)
	img := image(t, cli, brokerimage.NATS)
	port := FreePort(t)
	addr := "127.0.0.1:" + itoa(port)
	b := &Broker{Kind: "nats", Addr: addr, Image: img, cli: cli}
	b.ready = func(ctx context.Context) error { return natsReady(ctx, b.URL()) }
	b.start(t, testcontainers.ContainerRequest{
		Image: img.Ref,
		Cmd:   []string{"-js", "-sd", "/data", "-p", "4222"},
	}, "4222/tcp", port)
	return b
}

func (b *Broker) start(t testing.TB, req testcontainers.ContainerRequest, cport string, hostPort int) {
	t.Helper()
	p := network.MustParsePort(cport)
	req.ExposedPorts = []string{cport}
	req.HostConfigModifier = func(hc *container.HostConfig) {
		hc.PortBindings = network.PortMap{p: {{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: itoa(hostPort)}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: req,
		Started:          true,
	})
	if c != nil {
		b.c = c
		t.Cleanup(func() { b.terminate(t) })
	}
	if err != nil {
		t.Fatalf("brokertest: start %s container: %v", b.Kind, err)
	}
	b.waitReady(t, ctx)
}

func (b *Broker) waitReady(t testing.TB, ctx context.Context) {
	t.Helper()
	if err := PollUntil(ctx, startTimeout, 100*time.Millisecond, b.ready); err != nil {
		t.Fatalf("brokertest: %s at %s not ready: %v\n%s", b.Kind, b.Addr, err, b.Logs())
	}
}

func (b *Broker) terminate(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b.mu.Lock()
	paused := b.paused
	b.mu.Unlock()
	if paused {
		_, _ = b.cli.ContainerUnpause(ctx, b.c.GetContainerID(), client.ContainerUnpauseOptions{})
	}
	if t.Failed() {
		t.Logf("brokertest: %s container logs (tail):\n%s", b.Kind, b.Logs())
	}
	if err := b.c.Terminate(ctx); err != nil {
		t.Errorf("brokertest: terminate %s container: %v", b.Kind, err)
	}
}

// Stop stops the container (SIGTERM, then SIGKILL after 10 s); its data is
// kept for Start.
func (b *Broker) Stop(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	d := stopTimeout
	if err := b.c.Stop(ctx, &d); err != nil {
		t.Fatalf("brokertest: stop %s: %v", b.Kind, err)
	}
}

// Start starts a stopped container again, on the same address and with its
// data, and waits until the broker is ready.
func (b *Broker) Start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := b.c.Start(ctx); err != nil {
		t.Fatalf("brokertest: start %s: %v\n%s", b.Kind, err, b.Logs())
	}
	b.waitReady(t, ctx)
}

// Restart is Stop then Start.
func (b *Broker) Restart(t testing.TB) {
	t.Helper()
	b.Stop(t)
	b.Start(t)
}

// Pause freezes the broker's processes (docker pause): connections stay
// open but nothing answers, like a hung or partitioned broker.
func (b *Broker) Pause(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := b.cli.ContainerPause(ctx, b.c.GetContainerID(), client.ContainerPauseOptions{}); err != nil {
		t.Fatalf("brokertest: pause %s: %v", b.Kind, err)
	}
	b.mu.Lock()
	b.paused = true
	b.mu.Unlock()
}

// Unpause resumes a paused broker and waits until it is ready.
func (b *Broker) Unpause(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if _, err := b.cli.ContainerUnpause(ctx, b.c.GetContainerID(), client.ContainerUnpauseOptions{}); err != nil {
		t.Fatalf("brokertest: unpause %s: %v", b.Kind, err)
	}
	b.mu.Lock()
	b.paused = false
	b.mu.Unlock()
	b.waitReady(t, ctx)
}

// Logs returns the tail of the container's output (for failure messages).
func (b *Broker) Logs() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := b.c.Logs(ctx)
	if err != nil {
		return fmt.Sprintf("(logs: %v)", err)
	}
	defer rc.Close()
	out, _ := io.ReadAll(io.LimitReader(rc, 1<<20))
	const tail = 4000
	if len(out) > tail {
		out = out[len(out)-tail:]
	}
	return string(bytes.ToValidUTF8(out, []byte("?")))
}

func kafkaReady(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := (&kafka.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	brokers, err := conn.Brokers()
	if err != nil {
		return err
	}
	if len(brokers) == 0 {
		return fmt.Errorf("no brokers in metadata")
	}
	return nil
}

func natsReady(ctx context.Context, url string) error {
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second), nats.NoReconnect())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

package kafkatest

import (
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Cluster is a running in-process Kafka cluster. Restart stops and starts it
// again on the same ports (and, with a data dir, the same data), which is how
// tests simulate a broker restart. Cluster is safe for concurrent use.
type Cluster struct {
	opts  []kfake.Opt
	ports []int

	mu sync.Mutex
	c  *kfake.Cluster // nil while stopped; guarded by mu
}

// New starts a cluster of one broker listening on 127.0.0.1 (kfake binds
// loopback only) and returns its addresses and a cleanup that stops it. The
// cleanup is idempotent.
func New(opts ...kfake.Opt) (addrs []string, cleanup func(), err error) {
	c, err := Start(opts...)
	if err != nil {
		return nil, nil, err
	}
	return c.Addrs(), c.Close, nil
}

// Start is New returning the Cluster itself, for tests that restart it.
func Start(opts ...kfake.Opt) (*Cluster, error) {
	all := append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)
	c, err := kfake.NewCluster(all...)
	if err != nil {
		return nil, fmt.Errorf("kafkatest: start cluster: %w", err)
	}
	cl := &Cluster{c: c}
	for _, a := range c.ListenAddrs() {
		_, p, err := net.SplitHostPort(a)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("kafkatest: listen address %q: %w", a, err)
		}
		var port int
		if _, err := fmt.Sscan(p, &port); err != nil {
			c.Close()
			return nil, fmt.Errorf("kafkatest: listen port %q: %w", p, err)
		}
		cl.ports = append(cl.ports, port)
	}
	// Restart must come back on the same ports: clients keep the addresses.
	cl.opts = append(all, kfake.NumBrokers(len(cl.ports)), kfake.Ports(cl.ports...))
	return cl, nil
}

// MustStart starts a cluster for t and stops it when t ends.
func MustStart(t testing.TB, opts ...kfake.Opt) *Cluster {
	t.Helper()
	c, err := Start(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Addrs returns the brokers' host:port addresses on 127.0.0.1.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.ports))
	for i, p := range c.ports {
		out[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return out
}

// Kfake returns the running kfake cluster (nil while stopped after Close).
func (c *Cluster) Kfake() *kfake.Cluster {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.c
}

// Close stops the cluster. It is idempotent.
func (c *Cluster) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		c.c.Close()
		c.c = nil
	}
}

// Restart stops the cluster and starts it again on the same ports. Without
// a kfake.DataDir option the new cluster starts empty.
func (c *Cluster) Restart() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		c.c.Close()
		c.c = nil
	}
	k, err := kfake.NewCluster(c.opts...)
	if err != nil {
		return fmt.Errorf("kafkatest: restart cluster: %w", err)
	}
	c.c = k
	return nil
}

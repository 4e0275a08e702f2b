package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"time"
)

// The in-process brokers run in a child process of the demo binary: kfake
// keeps every message in memory, so in the demo's own process the heap
// figure would measure the broker, not the consumer. The child is the same
// executable with childEnv naming the broker; it prints one line,
// "<childReady> <address>", and serves until its stdin is closed (by the
// parent's Close, or by the parent's death).
const (
	childEnv   = "RINGFENCE_DEMO_BROKER_CHILD"
	childReady = "ringfence-demo-broker-ready"
)

// Bounds on the child's start and stop.
const (
	childStartTimeout = 30 * time.Second
	childStopTimeout  = 15 * time.Second
)

// ServeChild serves a broker and returns its exit code and true if this
// process was started as the demo's broker child; else it returns false at
// once. Main calls it first, and so must a test binary's TestMain when its
// tests start the kafka or nats broker.
func ServeChild() (int, bool) {
	name := os.Getenv(childEnv)
	if name == "" {
		return 0, false
	}
	return serveChild(name, childServers, os.Stdin, os.Stdout, os.Stderr), true
}

// childServers start each broker in the child: the address to print, and
// the stop.
var childServers = map[string]func() (string, func(), error){
	"kafka": startKfake,
	"nats":  startNATSServer,
}

// serveChild serves the broker name of servers until in ends.
func serveChild(name string, servers map[string]func() (string, func(), error), in io.Reader, out, errw io.Writer) int {
	// The parent stops its child after its own graceful shutdown; an
	// interrupt from the terminal reaches the whole process group, and must
	// not take the broker away under the parent's drain.
	signal.Ignore(os.Interrupt)
	start := servers[name]
	if start == nil {
		fmt.Fprintf(errw, "ringfence demo: %s=%q names no broker\n", childEnv, name)
		return 2
	}
	addr, stop, err := start()
	if err != nil {
		fmt.Fprintf(errw, "ringfence demo: start %s: %v\n", name, err)
		return 1
	}
	defer stop()
	fmt.Fprintf(out, "%s %s\n", childReady, addr)
	_, _ = io.Copy(io.Discard, in) // until EOF
	return 0
}

// child is a running broker child process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	errs  *tailBuffer
	done  chan error // the Wait result
	once  sync.Once
	err   error
}

// startChild starts the demo binary as the broker name and returns the
// address it serves on.
func startChild(ctx context.Context, name string) (string, *child, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, fmt.Errorf("demo: find the demo binary to start the %s broker in: %w", name, err)
	}
	cmd := exec.Command(exe, "demo")
	cmd.Env = append(os.Environ(), childEnv+"="+name)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	c := &child{cmd: cmd, stdin: stdin, errs: &tailBuffer{max: 4096}, done: make(chan error, 1)}
	cmd.Stderr = c.errs
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("demo: start the %s broker process: %w", name, err)
	}
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			first <- sc.Text()
		}
		close(first)
		_, _ = io.Copy(io.Discard, stdout)
		c.done <- cmd.Wait()
	}()
	t := time.NewTimer(childStartTimeout)
	defer t.Stop()
	var line string
	select {
	case l, ok := <-first:
		if !ok {
			c.Close()
			return "", nil, fmt.Errorf("demo: the %s broker process ended before it was ready: %s", name, c.errs.String())
		}
		line = l
	case <-t.C:
		c.Close()
		return "", nil, fmt.Errorf("demo: the %s broker process was not ready within %v: %s", name, childStartTimeout, c.errs.String())
	case <-ctx.Done():
		c.Close()
		return "", nil, ctx.Err()
	}
	addr, ok := strings.CutPrefix(line, childReady+" ")
	if !ok || addr == "" {
		c.Close()
		return "", nil, fmt.Errorf("demo: the %s broker process said %q", name, line)
	}
	return addr, c, nil
}

// Close stops the child: closing its stdin ends it; one that does not end
// within childStopTimeout is killed. Close is idempotent.
func (c *child) Close() error {
	c.once.Do(func() {
		c.stdin.Close()
		t := time.NewTimer(childStopTimeout)
		defer t.Stop()
		select {
		case c.err = <-c.done:
		case <-t.C:
			_ = c.cmd.Process.Kill()
			<-c.done
			c.err = errors.New("demo: broker process killed: it did not stop within " + childStopTimeout.String())
		}
		if c.err != nil && c.errs.Len() > 0 {
			c.err = fmt.Errorf("%w: %s", c.err, c.errs.String())
		}
	})
	return c.err
}

// tailBuffer keeps the last max bytes written to it. Safe for concurrent
// use.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.b)
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

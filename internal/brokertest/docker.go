package brokertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"

	"github.com/ringfence/ringfence/internal/brokerimage"
)

var docker struct {
	once sync.Once
	cli  *testcontainers.DockerClient
	err  error
}

// RequireDocker returns a Docker client, or ends the test: t.Skip with one
// line when Docker is not reachable, t.Fatal instead when CI is set.
func RequireDocker(t testing.TB) client.APIClient {
	t.Helper()
	docker.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		docker.cli, docker.err = testcontainers.NewDockerClientWithOpts(ctx)
		if docker.err == nil {
			_, docker.err = docker.cli.Ping(ctx, client.PingOptions{})
		}
	})
	noDocker(t, docker.err)
	return docker.cli
}

// noDocker ends the test when err (from reaching Docker) is not nil.
func noDocker(t testing.TB, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("brokertest: Docker is not reachable and CI is set: %v", err)
	}
	t.Skipf("brokertest: Docker is not reachable, skipping container test: %v", err)
}

type imageSlot struct {
	mu  sync.Mutex // held while building, so one build per spec
	img *brokerimage.Image
}

var images struct {
	mu    sync.Mutex
	slots map[string]*imageSlot // protected by mu
}

// image builds (or reuses) the image for s once per test binary; different
// specs build concurrently.
func image(t testing.TB, cli client.APIClient, s brokerimage.Spec) brokerimage.Image {
	t.Helper()
	img, fresh, err := ensureImage(cli, s)
	if err != nil {
		t.Fatalf("brokertest: image %s: %v", s.Name, err)
	}
	if fresh {
		logImage(t.Logf, s, img)
	}
	return img
}

func logImage(logf func(string, ...any), s brokerimage.Spec, img brokerimage.Image) {
	switch {
	case img.Override:
		logf("brokertest: using %s from %s", img.Ref, s.EnvOverride)
	case img.Built:
		logf("brokertest: built %s (compile %v, image %v)", img.Ref, img.BinaryTime.Round(time.Millisecond), img.ImageTime.Round(time.Millisecond))
	default:
		logf("brokertest: reusing %s (compile %v)", img.Ref, img.BinaryTime.Round(time.Millisecond))
	}
}

// ensureImage returns the image for s, building it on the first call; fresh
// is true for the call that produced it.
func ensureImage(cli client.APIClient, s brokerimage.Spec) (img brokerimage.Image, fresh bool, err error) {
	images.mu.Lock()
	if images.slots == nil {
		images.slots = map[string]*imageSlot{}
	}
	slot := images.slots[s.Name]
	if slot == nil {
		slot = &imageSlot{}
		images.slots[s.Name] = slot
	}
	images.mu.Unlock()

	slot.mu.Lock()
	defer slot.mu.Unlock()
	if slot.img != nil {
		return *slot.img, false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	img, err = brokerimage.Ensure(ctx, cli, s, moduleDir())
	if err != nil {
		return brokerimage.Image{}, false, err
	}
	slot.img = &img
	return img, true, nil
}

// Prebuild builds (or finds) the Kafka and NATS images at once, for a
// TestMain to call before m.Run so that a first, cold build does not count
// against the test timeout. Without Docker it does nothing and returns nil:
// the tests then skip or fail through RequireDocker. Build errors are
// returned (and met again by the tests).
func Prebuild(logf func(string, ...any)) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return nil
	}
	defer cli.Close()
	if _, err := cli.Ping(ctx, client.PingOptions{}); err != nil {
		return nil
	}
	specs := []brokerimage.Spec{brokerimage.Kafka, brokerimage.NATS}
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, s := range specs {
		wg.Go(func() {
			img, fresh, err := ensureImage(cli, s)
			if err == nil && fresh {
				logImage(logf, s, img)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// moduleDir is this package's source directory: inside the ringfence module,
// where `go build` resolves the broker packages.
func moduleDir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "."
	}
	if _, err := os.Stat(file); err != nil { // built with -trimpath
		return "."
	}
	return filepath.Dir(file)
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("brokertest: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// PollUntil calls f every interval until it returns nil or timeout passes,
// and returns f's last error.
func PollUntil(ctx context.Context, timeout, interval time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %v: %w", timeout, err)
		case <-tick.C:
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

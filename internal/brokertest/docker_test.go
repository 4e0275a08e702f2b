package brokertest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestRequireDockerWithoutDocker runs a child test that cannot reach Docker:
// it must skip with one line, or fail when CI is set.
func TestRequireDockerWithoutDocker(t *testing.T) {
	if os.Getenv("BROKERTEST_CHILD") == "1" {
		noDocker(t, errors.New("dial unix /nonexistent/docker.sock: no such file"))
		t.Fatal("noDocker returned without Docker")
	}
	t.Parallel()
	tests := []struct {
		name, ci, want string
		wantFail       bool
	}{
		{"skips locally", "", "--- SKIP", false},
		{"fails in CI", "true", "--- FAIL", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestRequireDockerWithoutDocker$", "-test.v")
			cmd.Env = append(os.Environ(), "BROKERTEST_CHILD=1", "CI="+tt.ci)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if failed := errors.As(err, &exit); failed != tt.wantFail {
				t.Fatalf("child failed=%v (%v), want %v:\n%s", failed, err, tt.wantFail, out)
			}
			if !strings.Contains(string(out), tt.want) || !strings.Contains(string(out), "Docker is not reachable") {
				t.Fatalf("child output lacks %q and the reason:\n%s", tt.want, out)
			}
		})
	}
}

func TestPollUntil(t *testing.T) {
	t.Parallel()
	calls := 0
	err := PollUntil(context.Background(), 5*time.Second, time.Millisecond, func(context.Context) error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("PollUntil = %v after %d calls, want nil after 3", err, calls)
	}
	sentinel := errors.New("never")
	err = PollUntil(context.Background(), 20*time.Millisecond, time.Millisecond, func(context.Context) error { return sentinel })
	if !errors.Is(err, sentinel) {
		t.Fatalf("PollUntil = %v, want it to wrap the last error", err)
	}
}

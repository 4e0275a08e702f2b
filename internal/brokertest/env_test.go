package brokertest

import (
	"os"
	"testing"

	"github.com/testcontainers/testcontainers-go"
)

// The README's test command exports nothing: the package must have turned
// the reaper off and pointed testcontainers at loopback by itself (unless
// the environment says otherwise, which this test then reports).
func TestTestcontainersConfigNeedsNoExports(t *testing.T) {
	cfg := testcontainers.ReadConfig()
	if !cfg.RyukDisabled {
		t.Errorf("testcontainers sees the reaper enabled; TESTCONTAINERS_RYUK_DISABLED must default to true")
	}
	// testcontainers reads the host override from the environment each time
	// it maps a port.
	if os.Getenv("TESTCONTAINERS_HOST_OVERRIDE") == "" {
		t.Errorf("testcontainers sees no host override; TESTCONTAINERS_HOST_OVERRIDE must default to 127.0.0.1")
	}
}

func TestEnvDefaultsKeepUserValues(t *testing.T) {
	env := map[string]string{"TESTCONTAINERS_HOST_OVERRIDE": "10.1.2.3"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	set := func(k, v string) error { env[k] = v; return nil }
	applyEnvDefaults(lookup, set)
	if got := env["TESTCONTAINERS_HOST_OVERRIDE"]; got != "10.1.2.3" {
		t.Errorf("user's host override replaced: got %q", got)
	}
	if got := env["TESTCONTAINERS_RYUK_DISABLED"]; got != "true" {
		t.Errorf("reaper default not applied: got %q", got)
	}
}

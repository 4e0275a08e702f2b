package integration

import (
	"fmt"
	"os"
	"testing"

	"github.com/ringfence/ringfence/internal/brokertest"
)

// TestMain lets the test binary double as the consumer process of the
// scenarios: started with childEnv set, it runs one consumer (see child_test.go)
// instead of the tests. Otherwise it builds the broker images first, both at
// once and before the test timeout starts (a cold build compiles nats-server).
func TestMain(m *testing.M) {
	if cfg := os.Getenv(childEnv); cfg != "" {
		os.Exit(childMain(cfg))
	}
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	if err := brokertest.Prebuild(logf); err != nil {
		logf("integration: building broker images: %v", err)
	}
	os.Exit(m.Run())
}

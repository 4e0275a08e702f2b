package integration

import (
	"os"
	"testing"
)

// TestMain lets the test binary double as the consumer process of the
// scenarios: started with childEnv set, it runs one consumer (see child_test.go)
// instead of the tests.
func TestMain(m *testing.M) {
	if cfg := os.Getenv(childEnv); cfg != "" {
		os.Exit(childMain(cfg))
	}
	os.Exit(m.Run())
}

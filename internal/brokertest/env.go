package brokertest

import "os"

// Defaults for testcontainers-go that need no container registry, set when
// this package is loaded and only where the user has not set them, so that
// `go test ./...` needs nothing exported:
//
//   - TESTCONTAINERS_RYUK_DISABLED=true: the reaper's image would need a
//     registry; every test terminates the containers it started.
//   - TESTCONTAINERS_HOST_OVERRIDE=127.0.0.1: without it testcontainers
//     dials the Docker bridge's gateway address for mapped ports, while
//     every port here is mapped on loopback.
//
// Either variable, set in the environment, wins (e.g. a remote Docker host
// needs its own address). testcontainers-go reads them on first use, which
// comes after package initialisation.
var envDefaults = map[string]string{
	"TESTCONTAINERS_RYUK_DISABLED": "true",
	"TESTCONTAINERS_HOST_OVERRIDE": "127.0.0.1",
}

func init() { applyEnvDefaults(os.LookupEnv, os.Setenv) }

// applyEnvDefaults sets each of envDefaults that lookup does not find.
func applyEnvDefaults(lookup func(string) (string, bool), set func(string, string) error) {
	for k, v := range envDefaults {
		if _, ok := lookup(k); !ok {
			_ = set(k, v)
		}
	}
}

// Command ringfence runs the demo (the main job) and manages dead letters.
//
//	ringfence demo [flags]                     noisy-neighbour demo and its measurements (--scenario outage|long-outage|slow|hang|hot)
//	ringfence dlq ls|peek|replay|purge [flags] list, inspect, replay and purge a tenant's dead letters
//	ringfence console [flags]                  the ops console (DLQ browser) in a web browser
//	ringfence spill ls [flags]                 list the tenants whose messages wait in a spill log
//	ringfence status [flags]                   the group's processes, partition owners and tenants not healthy
//	ringfence tenant VERB TENANT --reason TEXT hold, release, quarantine, open, close... a tenant, durably
//
// Exit codes: 0 success, 1 runtime failure, 2 usage error.
package main

import (
	"fmt"
	"io"
	"os"
)

const usage = `ringfence: per-tenant resilience for Kafka and NATS consumers

Usage:
  ringfence demo [flags]      run the noisy-neighbour demo (in-process Kafka and NATS by default;
                              --scenario outage|long-outage|slow|hang|hot)
  ringfence dlq <command>     list, peek, replay and purge a tenant's dead letters
  ringfence console [flags]   browse, replay and purge dead letters in a web browser
  ringfence spill ls [flags]  list the tenants whose messages wait in a spill log
  ringfence status [flags]    the group's processes, partition owners and tenants not healthy
  ringfence tenant <verb>     hold|release|quarantine|unquarantine|open|close|auto|weight N|
                              concurrency N a tenant across the group, durably (--reason TEXT)

Run 'ringfence <command> --help' for a command's flags.
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "demo":
		return runDemo(args[1:])
	case "dlq":
		return runDLQ(args[1:], stdout, stderr)
	case "console":
		return runConsoleMain(args[1:], stdout, stderr)
	case "spill":
		return runSpill(args[1:], stdout, stderr)
	case "status":
		return runStatus(args[1:], stdout, stderr)
	case "tenant":
		return runTenant(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "ringfence: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

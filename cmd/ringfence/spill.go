package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	rfkafka "github.com/ringfence/ringfence/adapters/kafka"
	rfnats "github.com/ringfence/ringfence/adapters/nats"
)

const spillUsage = `Usage:
  ringfence spill ls --kafka HOST:PORT --topic SOURCE --group GROUP [--json]
  ringfence spill ls --nats URL --stream STREAM --durable DURABLE [--json]

ls lists the tenants whose messages wait in a spill log: the durable side log
the engine moves a tenant's messages to when it cannot make progress (parked
at its bound, stuck, or over its share of a partition), so that its
partition-mates never wait. Entries are removed once they are re-fed and
handled. With --json, one JSON object per line:
  {"type":"spill","tenant":{key,key_base64,token,no_tenant},"records":N,"where":"<topic or subject>","partitions":{"<p>":N}}
`

// spillLine is one tenant of `spill ls --json`.
type spillLine struct {
	Type       string           `json:"type"` // "spill"
	Tenant     jsonTenant       `json:"tenant"`
	Records    int64            `json:"records"`              // not yet re-fed and committed (copies included)
	Where      string           `json:"where"`                // Kafka topic or NATS subject
	Partitions map[string]int64 `json:"partitions,omitempty"` // Kafka: by source partition
}

func runSpill(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "ls" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprint(stdout, spillUsage)
			return 0
		}
		fmt.Fprint(stderr, spillUsage)
		return 2
	}
	fs := flag.NewFlagSet("ringfence spill ls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kafkaAddr := fs.String("kafka", "", "Kafka bootstrap broker `HOST:PORT`")
	topic := fs.String("topic", "", "Kafka source `TOPIC` (its spill topic is <topic>.spill)")
	group := fs.String("group", "", "the consumer `GROUP` whose spill logs to list (Kafka)")
	natsURL := fs.String("nats", "", "NATS server `URL`")
	stream := fs.String("stream", "", "the source JetStream `STREAM`")
	durable := fs.String("durable", "", "the consumer's `DURABLE` name (NATS)")
	asJSON := fs.Bool("json", false, "print JSON Lines for scripts")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "ringfence spill ls: "+format+"\n", a...)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return usage("unexpected arguments %q", fs.Args())
	case (*kafkaAddr == "") == (*natsURL == ""):
		return usage("give one of --kafka or --nats")
	case *kafkaAddr != "" && (*topic == "" || *group == ""):
		return usage("--kafka needs --topic and --group")
	case *natsURL != "" && (*stream == "" || *durable == ""):
		return usage("--nats needs --stream and --durable")
	case *timeout <= 0:
		return usage("--timeout must be positive")
	}
	if *kafkaAddr != "" {
		if err := checkHostPort(*kafkaAddr); err != nil {
			return usage("%v", err.(usageError).msg)
		}
		if err := checkTopic(*topic); err != nil {
			return usage("%v", err.(usageError).msg)
		}
	} else {
		if _, err := natsAddr(*natsURL); err != nil {
			return usage("%v", err.(usageError).msg)
		}
		for _, name := range []string{*stream, *durable} {
			if err := checkStream(name); err != nil {
				return usage("%v", err.(usageError).msg)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var lines []spillLine
	var err error
	if *kafkaAddr != "" {
		lines, err = kafkaSpills(ctx, *kafkaAddr, *topic, *group)
	} else {
		lines, err = natsSpills(ctx, *natsURL, *stream, *durable)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ringfence spill ls: %v\n", err)
		return 1
	}
	slices.SortFunc(lines, func(a, b spillLine) int {
		return strings.Compare(a.Tenant.KeyBase64+a.Where, b.Tenant.KeyBase64+b.Where)
	})
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, l := range lines {
			_ = enc.Encode(l)
		}
		return 0
	}
	if len(lines) == 0 {
		fmt.Fprintln(stdout, "no tenant has spilled messages waiting")
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tRECORDS\tWHERE\tTOKEN")
	for _, l := range lines {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", tenantLabel(rawTenant(l.Tenant)), l.Records, l.Where, l.Tenant.Token)
	}
	_ = tw.Flush()
	return 0
}

func kafkaSpills(ctx context.Context, addr, topic, group string) ([]spillLine, error) {
	if err := kafkaHandshake(ctx, addr); err != nil {
		return nil, err
	}
	sl, err := rfkafka.NewSpillLog([]string{addr}, topic, group)
	if err != nil {
		return nil, err
	}
	defer sl.Close()
	bs, err := sl.Backlog(ctx)
	if err != nil {
		return nil, err
	}
	var out []spillLine
	for _, b := range bs {
		if b.Total == 0 {
			continue // drained: only settled records until retention removes them
		}
		l := spillLine{Type: "spill", Tenant: tenantOf(b.Tenant), Records: b.Total, Where: b.Topic, Partitions: map[string]int64{}}
		for p, n := range b.Partitions {
			if n > 0 {
				l.Partitions[fmt.Sprint(p)] = n
			}
		}
		out = append(out, l)
	}
	return out, nil
}

func natsSpills(ctx context.Context, url, stream, durable string) ([]spillLine, error) {
	addr, _ := natsAddr(url)
	if err := reachable(ctx, addr); err != nil {
		return nil, fmt.Errorf("nats server %s unreachable: %w", url, err)
	}
	nc, err := nats.Connect(url, nats.Timeout(handshakeTimeout), nats.MaxReconnects(0), nats.Name("ringfence spill"))
	if err != nil {
		return nil, fmt.Errorf("nats server %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	// Look before opening: NewSpillLog would create a missing stream, and a
	// listing must change nothing.
	name := "RINGFENCE_SPILL_" + stream + "_" + durable
	if _, err := js.Stream(ctx, name); err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("no spill stream %s on %s: the engine of durable %q on stream %q never spilled, or a name is misspelt", name, url, durable, stream)
		}
		return nil, err
	}
	sl, err := rfnats.NewSpillLog(ctx, js, stream, durable)
	if err != nil {
		return nil, err
	}
	bs, err := sl.Backlog(ctx)
	if err != nil {
		return nil, err
	}
	var out []spillLine
	for _, b := range bs {
		out = append(out, spillLine{Type: "spill", Tenant: tenantOf(b.Tenant), Records: int64(b.Records), Where: b.Subject})
	}
	return out, nil
}

// rawTenant is the raw key of a JSON tenant.
func rawTenant(t jsonTenant) string {
	b, err := base64.StdEncoding.DecodeString(t.KeyBase64)
	if err != nil {
		return t.Key
	}
	return string(b)
}

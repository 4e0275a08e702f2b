package metrics_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/metrics"
	"github.com/ringfence/ringfence/metrics/dashboard"
)

const rulesFile = "rules/ringfence.rules.yml"

// prometheusTool returns the path of one of Prometheus' programs
// (promtool, prometheus). Without it the test is skipped, or fails under
// CI, which installs Debian's prometheus package (.ci/run).
func prometheusTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not installed; CI must install Debian's prometheus package (.ci/run)", name)
	}
	t.Skipf("%s is not installed (apt-get install prometheus); skipping", name)
	return ""
}

func promtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(prometheusTool(t, "promtool"), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestRulesPassPromtool(t *testing.T) {
	t.Parallel()
	promtool(t, "rules", "check", "rules", filepath.Base(rulesFile))
	promtool(t, "rules", "test", "rules", "ringfence.rules.test.yml")
}

// ruleFile is the part of a Prometheus rule file the tests read.
type ruleFile struct {
	Groups []struct {
		Name  string
		Rules []struct {
			Record, Alert, Expr, For string
		}
	}
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatal(err)
	}
	return rf
}

func TestRulesNameOnlyExportedSeries(t *testing.T) {
	t.Parallel()
	exported := exportedSeries(t)
	rf := readRules(t)
	recorded := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			for _, name := range seriesNames(r.Expr) {
				if !exported[name] && !recorded[name] {
					t.Errorf("%s%s: %s is neither exported by the collector nor recorded", r.Record, r.Alert, name)
				}
			}
		}
	}
}

func TestDashboardQueriesParseAndNameExportedSeries(t *testing.T) {
	t.Parallel()
	qs, err := dashboard.Queries()
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedSeries(t)
	// Grafana's variables, replaced by values PromQL accepts.
	vars := strings.NewReplacer("$__rate_interval", "5m", "$job", ".*", "$tenant", ".*")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, q := range qs {
		expr := vars.Replace(q.Expr)
		fmt.Fprintf(&rules, "      - record: dashboard_query_%d\n        expr: %q\n", i, expr)
		names := seriesNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: %q names no series", q.Panel, q.Expr)
		}
		for _, name := range names {
			if !exported[name] {
				t.Errorf("%s: %s is not exported by the collector", q.Panel, name)
			}
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.rules.yml"), []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, dir, "check", "rules", "dashboard.rules.yml")
}

// exportedSeries returns the series names a collector exports over a
// consumer that has handled, dead-lettered and parked messages of several
// tenants on one partition, so every per-tenant and per-partition series
// exists. Histograms count with their _bucket, _sum and _count series.
func exportedSeries(t *testing.T) map[string]bool {
	t.Helper()
	msgs := [][2]string{{"acme", "1"}, {"acme", "bad"}, {"globex", "1"}, {"globex", "2"}, {"globex", "3"}, {"", "no tenant"}}
	c := settledConsumer(t, msgs, map[string]bool{"globex": true}, func(s consumer.Stats) bool {
		return s.Handled == 1 && s.DeadLettered == 2 && s.Parked == 3
	})
	col, err := metrics.NewCollector(c)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM:
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[mf.GetName()+s] = true
			}
		case dto.MetricType_SUMMARY:
			for _, s := range []string{"_sum", "_count"} {
				names[mf.GetName()+s] = true
			}
		}
	}
	return names
}

// promqlWords are PromQL's keywords, and its aggregations, which may be
// followed by a grouping clause rather than "(".
var promqlWords = []string{"and", "or", "unless", "offset", "bool", "inf", "nan", "atan2",
	"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}

// seriesNames returns the metric names a PromQL expression selects: the
// identifiers outside strings, label matchers and ranges that are neither
// functions or aggregations (followed by "("), grouping label lists, nor
// keywords. It is a tokenizer, not a parser: promtool checks the syntax.
func seriesNames(expr string) []string {
	var names []string
	n := len(expr)
	skipTo := func(i int, end byte) int { // index after end, strings inside skipped
		for i < n && expr[i] != end {
			if q := expr[i]; q == '"' || q == '\'' || q == '`' {
				i = skipString(expr, i)
				continue
			}
			i++
		}
		return i + 1
	}
	for i := 0; i < n; {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(expr, i)
		case c == '{':
			i = skipTo(i+1, '}')
		case c == '[':
			i = skipTo(i+1, ']')
		case c >= '0' && c <= '9' || c == '.':
			for i < n && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdent(c):
			j := i
			for j < n && isIdent(expr[j]) {
				j++
			}
			word := expr[i:j]
			k := j
			for k < n && strings.IndexByte(" \t\n", expr[k]) >= 0 {
				k++
			}
			switch {
			case slices.Contains([]string{"by", "without", "on", "ignoring", "group_left", "group_right"}, word):
				if k < n && expr[k] == '(' {
					j = skipTo(k+1, ')')
				}
			case k < n && expr[k] == '(':
				// A function or an aggregation.
			case slices.Contains(promqlWords, strings.ToLower(word)):
			default:
				names = append(names, word)
			}
			i = j
		default:
			i++
		}
	}
	return names
}

func skipString(s string, i int) int {
	q := s[i]
	for i++; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if q != '`' {
				i++
			}
		case q:
			return i + 1
		}
	}
	return i
}

func isIdent(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func TestSeriesNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`sum by (tenant, le) (rate(a_bucket{le=~"60(\\.0)?",x="}"}[5m])) / on (job) group_left (tenant) b:rec`, []string{"a_bucket", "b:rec"}},
		{`histogram_quantile(0.99, x) > (14.4 * 0.01) and y offset 15m`, []string{"x", "y"}},
		{`count(max without (instance, pod) (p{t!="_other"}) > 0) or vector(0)`, []string{"p"}},
		{"changes(c[15m]) == 0\nand\nd > bool 1e3", []string{"c", "d"}},
	} {
		if got := seriesNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("seriesNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

var forLine = regexp.MustCompile(`(?m)^(\s+for:\s*)\S+\s*$`)

// rulesWithFor returns the shipped rules with every alert's "for:" set to
// d, the templating README.md describes for tests and drills.
func rulesWithFor(t *testing.T, d string) []byte {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	out := forLine.ReplaceAll(b, []byte("${1}"+d))
	if len(forLine.FindAll(b, -1)) == 0 || !strings.Contains(string(out), "for: "+d) {
		t.Fatalf("no for: lines rewritten in %s", rulesFile)
	}
	return out
}

// The dwell objective's bucket, as the rules match it.
var objectiveBucket = regexp.MustCompile(`le=~"([0-9.]+)\(`)

func TestRulesDwellObjectiveIsABucket(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	found := objectiveBucket.FindAllSubmatch(b, -1)
	if len(found) == 0 {
		t.Fatalf("no dwell bucket matcher in %s", rulesFile)
	}
	for _, m := range found {
		le, err := strconv.ParseFloat(string(m[1]), 64)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(consumer.DwellBuckets(), func(d time.Duration) bool { return d.Seconds() == le }) {
			t.Errorf("le %s is not a bound of consumer.DwellBuckets %v", m[1], consumer.DwellBuckets())
		}
	}
}

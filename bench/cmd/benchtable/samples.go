package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// A sample is one value a benchmark line reported, and the process (one
// output file) that reported it.
type sample struct {
	proc  int
	value float64
}

// samples holds every value of every benchmark line read, by benchmark
// name (GOMAXPROCS suffix removed) and unit. The first lookup that finds
// nothing is kept in err: a table with a missing figure is an error.
type samples struct {
	by  map[string]map[string][]sample
	err error
}

func newSamples() *samples { return &samples{by: map[string]map[string][]sample{}} }

// line matches a benchmark result: name, optional -GOMAXPROCS, iterations,
// then value-unit pairs.
var line = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.+)$`)

// read adds the benchmark lines of r, the output of process proc; other
// lines (logs, PASS, ok) are skipped. A line's iteration count is kept as
// the unit "N".
func (s *samples) read(r io.Reader, proc int) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		f := append([]string{m[2], "N"}, strings.Fields(m[3])...)
		if len(f)%2 != 0 {
			continue
		}
		name := strings.TrimPrefix(m[1], "Benchmark")
		for i := 0; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return fmt.Errorf("benchtable: %s: %q is not a number", name, f[i])
			}
			units := s.by[name]
			if units == nil {
				units = map[string][]sample{}
				s.by[name] = units
			}
			units[f[i+1]] = append(units[f[i+1]], sample{proc, v})
		}
	}
	return sc.Err()
}

// values returns the values of name's unit, in proc (or in every process if
// proc < 0), and records an error if there are none.
func (s *samples) values(name, unit string, proc int) []float64 {
	var out []float64
	for _, x := range s.by[name][unit] {
		if proc < 0 || x.proc == proc {
			out = append(out, x.value)
		}
	}
	if len(out) == 0 && s.err == nil {
		if proc < 0 {
			s.err = fmt.Errorf("benchtable: no %s for Benchmark%s", unit, name)
		} else {
			s.err = fmt.Errorf("benchtable: no %s for Benchmark%s in process %d", unit, name, proc)
		}
	}
	return out
}

// med is the median of name's unit over every process (NaN if none).
func (s *samples) med(name, unit string) float64 { return median(s.values(name, unit, -1)) }

// span is the least and greatest of name's unit over every process.
func (s *samples) span(name, unit string) (lo, hi float64) {
	v := s.values(name, unit, -1)
	if len(v) == 0 {
		return math.NaN(), math.NaN()
	}
	return slices.Min(v), slices.Max(v)
}

// count is how many values of name's unit were read.
func (s *samples) count(name, unit string) int { return len(s.values(name, unit, -1)) }

// procs is the number of processes that reported name's unit.
func (s *samples) procs(name, unit string) int {
	seen := map[int]bool{}
	for _, x := range s.by[name][unit] {
		seen[x.proc] = true
	}
	return len(seen)
}

// paired returns, for each process that reported both, the median of a's
// unit over the median of b's unit in that process, in process order.
func (s *samples) paired(a, b, unit string) []float64 {
	var procs []int
	for _, x := range s.by[a][unit] {
		procs = append(procs, x.proc)
	}
	slices.Sort(procs)
	procs = slices.Compact(procs)
	var out []float64
	for _, p := range procs {
		bv := s.by[b][unit]
		if !slices.ContainsFunc(bv, func(x sample) bool { return x.proc == p }) {
			continue
		}
		out = append(out, median(s.values(a, unit, p))/median(s.values(b, unit, p)))
	}
	if len(out) == 0 && s.err == nil {
		s.err = fmt.Errorf("benchtable: no process reported %s for both Benchmark%s and Benchmark%s", unit, a, b)
	}
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

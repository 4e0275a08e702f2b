package demo

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// view shows a run's progress: a per-tenant table redrawn in place on a
// terminal, one plain line per second otherwise.
type view struct {
	w     io.Writer
	tty   bool
	every time.Duration // plain mode: line interval

	mu    sync.Mutex
	lines int       // lines drawn last time (tty)
	last  time.Time // last plain line
}

func newView(w io.Writer, tty bool) *view { return &view{w: w, tty: tty, every: time.Second} }

// Observe renders s.
func (v *view) Observe(s Snapshot) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.tty {
		v.draw(s)
		return
	}
	if time.Since(v.last) < v.every {
		return
	}
	v.last = time.Now()
	fmt.Fprintln(v.w, plainLine(s))
}

// Done ends a run's live view.
func (v *view) Done() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.lines = 0
	v.last = time.Time{}
}

func phase(s Snapshot) string {
	switch {
	case !s.Producing:
		return "draining"
	case s.FaultOn:
		k := s.Kind
		if k == "" {
			k = KindOutage
		}
		return strings.ToUpper(k.Role())
	}
	return "running"
}

func plainLine(s Snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-6s %-9s t=%4.1fs %-8s produced=%d handled=%d backlog=%d parked=%d dead=%d lag=%d heap=%.0fMiB",
		s.Broker, s.Mode, s.Elapsed.Seconds(), phase(s), s.Produced, s.Handled, s.Backlog, s.Parked, s.Dead, s.Lag, float64(s.Heap)/(1<<20))
	var open []string
	if s.Mode == Shared {
		if s.SharedState != policy.Closed {
			open = append(open, "shared:"+s.SharedState.String())
		}
	} else {
		for _, r := range s.Rows {
			if r.State != policy.Closed {
				open = append(open, r.Tenant+":"+r.State.String())
			}
		}
	}
	if len(open) > 0 {
		fmt.Fprintf(&b, " breakers=%s", strings.Join(open, ","))
	}
	return b.String()
}

func (v *view) draw(s Snapshot) {
	var b strings.Builder
	if v.lines > 0 {
		fmt.Fprintf(&b, "\x1b[%dF", v.lines) // back to the first line drawn
	}
	n := 0
	line := func(format string, args ...any) {
		fmt.Fprintf(&b, format, args...)
		b.WriteString("\x1b[K\n")
		n++
	}
	line("%s · %s · %s · %4.1fs / %v · %s · commit lag %d · heap %.0f MiB", s.Broker, s.Kind, s.Mode.Title(), s.Elapsed.Seconds(), s.Duration, phase(s), s.Lag, float64(s.Heap)/(1<<20))
	line("%-12s %-7s %8s %8s %7s %6s  %s", "tenant", "", "handled", "backlog", "parked", "dead", "breaker")
	for _, r := range s.Rows {
		parked := "-"
		if r.TrackedAlone {
			parked = fmt.Sprint(r.Parked)
		}
		state := r.State.String()
		if !r.TrackedAlone {
			state += " (shared)"
		}
		line("%-12s %-7s %8d %8d %7s %6d  %s%s", r.Tenant, r.Role, r.Handled, r.Backlog, parked, r.Dead, stateMark(r.State), state)
	}
	line("%-12s %-7s %8d %8d %7d %6d", "total", "", s.Handled, s.Backlog, s.Parked, s.Dead)
	v.lines = n
	io.WriteString(v.w, b.String())
}

func stateMark(st policy.State) string {
	switch st {
	case policy.Open:
		return "■ "
	case policy.HalfOpen:
		return "◧ "
	}
	return "· "
}

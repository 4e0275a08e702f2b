package console

import (
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Size of a plot, in SVG user units (the page scales it).
const (
	plotW   = 240
	plotH   = 48
	plotPad = 2 // keeps the line off the frame
)

// PlotLine is one watched tenant's history (GET /plots as JSON): its
// samples, oldest first.
type PlotLine struct {
	Type    string       `json:"type"` // "plot"
	Tenant  Tenant       `json:"tenant"`
	EveryNS int64        `json:"every_ns"` // Options.HistoryEvery
	Points  []PlotPoint  `json:"points"`
	Now     *TenantStats `json:"now"` // the tenant in the snapshot shown; null: not listed
}

// PlotPoint is one sample: goodput (messages handled per second since the
// previous sample) and time lag (seconds; see TenantStats.TimeLagNS).
type PlotPoint struct {
	Time     time.Time `json:"time"`
	Goodput  float64   `json:"goodput"`
	TimeLagS float64   `json:"time_lag_s"`
}

// plotsView is the plots section: one card per watched tenant.
type plotsView struct {
	Cards  []plotCard
	Window string // the span a plot covers, e.g. "5m"
	Max    int    // HistoryTenants
}

type plotCard struct {
	Row     TenantStats // the tenant in the snapshot
	Goodput sparkline
	Lag     sparkline
}

// sparkline is one plot, drawn by the "spark" template: a line from 0
// (bottom) to Max (top) over the plot's window (left: Window ago, right:
// the last sample).
type sparkline struct {
	Name      string // "goodput", "time lag"
	Path      string // SVG path data; "" when there is nothing to draw
	Max, Last string // the y axis' top label, and the newest value
	W, H      int
	Top, Base int // y of the max and the zero line
	Points    int
	Unit      string
	Window    string // the span it covers
}

// watchedTenant is a watched tenant's samples and its row in the
// snapshot (nil: the snapshot does not list it).
type watchedTenant struct {
	key     string
	samples []sample
	row     *TenantStats
}

// watchedIn returns the watched tenants by key, with their rows among
// rows, and the time of the last sample.
func (c *Console) watchedIn(rows []TenantStats) ([]watchedTenant, time.Time) {
	hist, last := c.hist.watched()
	out := make([]watchedTenant, 0, len(hist))
	byToken := make(map[string]int, len(hist))
	for k, ss := range hist {
		byToken[TenantOf(k).Token] = len(out)
		out = append(out, watchedTenant{key: k, samples: ss})
	}
	for i := range rows {
		if j, ok := byToken[rows[i].Tenant.Token]; ok {
			out[j].row = &rows[i]
		}
	}
	slices.SortFunc(out, func(a, b watchedTenant) int { return strings.Compare(a.key, b.key) })
	return out, last
}

// plots builds the plots of the watched tenants the snapshot lists, in
// trouble first, then by key.
func (c *Console) plots(rows []TenantStats) plotsView {
	ws, last := c.watchedIn(rows)
	span := time.Duration(c.o.HistoryPoints) * c.o.HistoryEvery
	v := plotsView{Window: spanText(span), Max: c.o.HistoryTenants}
	start := last.Add(-span)
	for _, w := range ws {
		if w.row == nil {
			continue
		}
		gp := make([]float64, len(w.samples))
		lag := make([]float64, len(w.samples))
		at := make([]time.Time, len(w.samples))
		for j, s := range w.samples {
			gp[j], lag[j], at[j] = s.goodput, s.lag, s.at
		}
		v.Cards = append(v.Cards, plotCard{
			Row:     *w.row,
			Goodput: spark("goodput", "/s", at, gp, start, span, c.o.HistoryEvery),
			Lag:     spark("time lag", "s", at, lag, start, span, c.o.HistoryEvery),
		})
	}
	slices.SortStableFunc(v.Cards, func(a, b plotCard) int {
		ta, tb := inTrouble(&a.Row), inTrouble(&b.Row)
		switch {
		case ta && !tb:
			return -1
		case tb && !ta:
			return 1
		}
		return 0
	})
	return v
}

// spark draws values taken at times at into a sparkline over [start,
// start+span]; a gap of more than two sampling intervals breaks the line.
func spark(name, unit string, at []time.Time, vals []float64, start time.Time, span, every time.Duration) sparkline {
	s := sparkline{Name: name, Unit: unit, W: plotW, H: plotH, Top: plotPad, Base: plotH - plotPad, Points: len(vals), Window: spanText(span)}
	top := 0.0
	for _, v := range vals {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			top = max(top, v)
		}
	}
	axis := niceCeil(top)
	s.Max = numText(axis) + unit
	if len(vals) == 0 {
		s.Last = "-"
		return s
	}
	s.Last = numText(vals[len(vals)-1]) + unit
	var b strings.Builder
	for i, v := range vals {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		x := float64(plotW) * at[i].Sub(start).Seconds() / span.Seconds()
		y := float64(s.Base) - (float64(s.Base-s.Top) * v / axis)
		cmd := "L"
		if b.Len() == 0 || at[i].Sub(at[i-1]) > 2*every {
			cmd = "M"
		}
		b.WriteString(cmd)
		b.WriteString(strconv.FormatFloat(max(0, min(x, plotW)), 'f', 1, 64))
		b.WriteByte(',')
		b.WriteString(strconv.FormatFloat(y, 'f', 1, 64))
	}
	// A lone point is drawn as a short flat stroke.
	if p := b.String(); !strings.Contains(p, "L") {
		b.WriteString("h2")
	}
	s.Path = b.String()
	return s
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1), so
// the axis label is a round number.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// numText shows a plotted value: whole numbers from 10 up, one decimal
// below.
func numText(v float64) string {
	if v >= 10 || v == math.Trunc(v) {
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// spanText shows a plot's window: "90s", "5m", "1h30m".
func spanText(d time.Duration) string {
	switch {
	case d < 2*time.Minute:
		return strconv.Itoa(int(d.Round(time.Second)/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d.Round(time.Minute)/time.Minute)) + "m"
	}
	h, m := d.Round(time.Minute)/time.Hour, d.Round(time.Minute)%time.Hour/time.Minute
	if m == 0 {
		return strconv.Itoa(int(h)) + "h"
	}
	return strconv.Itoa(int(h)) + "h" + strconv.Itoa(int(m)) + "m"
}

// plotsPage is GET /plots: the watched tenants' plots (the tenant view
// shows the same section and live.js refreshes it from here). JSON: one
// PlotLine per watched tenant.
func (c *Console) plotsPage(w http.ResponseWriter, r *http.Request) {
	snap := c.snaps.get(r.Context())
	if wantJSON(r) {
		ws, _ := c.watchedIn(snap.line.Tenants)
		enc := jsonLines(w, http.StatusOK)
		for _, wt := range ws {
			l := PlotLine{Type: "plot", Tenant: TenantOf(wt.key), EveryNS: int64(c.o.HistoryEvery), Points: []PlotPoint{}, Now: wt.row}
			for _, s := range wt.samples {
				l.Points = append(l.Points, PlotPoint{Time: s.at.UTC(), Goodput: s.goodput, TimeLagS: s.lag})
			}
			enc.Encode(l)
		}
		return
	}
	c.html(w, http.StatusOK, "plots", c.page(r, "plots", "Watched tenants", c.plots(snap.line.Tenants)))
}

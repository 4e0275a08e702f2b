package console

import (
	"net/http"
	"slices"
	"strconv"
	"time"
)

// Bounds of the live stream.
const (
	// streamWriteTimeout bounds one write to a live stream: a viewer that
	// stops reading is dropped instead of holding its goroutine.
	streamWriteTimeout = 10 * time.Second
	// streamEvents bounds the events one update of a live stream carries.
	streamEvents = 100
)

func (c *Console) routes() *http.ServeMux {
	mux := http.NewServeMux()
	get := func(pattern string, h http.HandlerFunc) {
		mux.HandleFunc("GET "+pattern, func(w http.ResponseWriter, r *http.Request) {
			if c.login(w, r) {
				return
			}
			h(w, r)
		})
	}
	get("/{$}", c.home)
	get("/live", c.live)
	get("/log", c.log)
	get("/plots", c.plotsPage)
	get("/dlq", c.dlqList)
	get("/dlq/{token}", c.dlqTenant)
	get("/fleet", c.fleetPage)
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(staticFS)))

	// Cross-origin browser POSTs are refused before anything else looks at
	// them (Sec-Fetch-Site, Origin); then the token decides.
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, "post", http.StatusForbidden, "cross-origin request refused")
	}))
	mux.Handle("POST /dlq/{token}/replay", cop.Handler(http.HandlerFunc(c.replay)))
	mux.Handle("POST /dlq/{token}/purge", cop.Handler(http.HandlerFunc(c.purge)))
	mux.Handle("POST /fleet/control", cop.Handler(http.HandlerFunc(c.fleetControl)))
	return mux
}

// tenantsView is the tenant view's body.
type tenantsView struct {
	Stats    StatsLine
	Rows     []TenantStats // the shown ones, in trouble first
	Hidden   int           // tenants not shown (MaxTenantRows)
	Events   []EventLine   // newest first
	EventSeq uint64        // the last event shown; the live stream goes on from it
	Refresh  int64         // ms between live updates
	MaxRows  int           // MaxTenantRows
	Plots    plotsView     // the watched tenants' plots
	Every    int64         // ms between samples (HistoryEvery)
}

// inTrouble is the order of the tenant rows: open or half-open breakers,
// parked or spilling tenants, and those whose DLQ refuses their dead
// letters first (live.js sorts the same way).
func inTrouble(t *TenantStats) bool {
	return t.State != "closed" || t.Parked > 0 || t.Spilling > 0 || t.DLQUnavailable
}

// home is the tenant view: GET /.
func (c *Console) home(w http.ResponseWriter, r *http.Request) {
	if c.engine.Load() == nil && c.dlq.Load() != nil && !wantJSON(r) {
		http.Redirect(w, r, c.o.Prefix+"dlq", http.StatusSeeOther)
		return
	}
	snap := c.snaps.get(r.Context())
	if wantJSON(r) {
		w.Header().Set("Content-Type", "application/x-ndjson; charset=utf-8")
		w.Write(append(snap.json[:len(snap.json):len(snap.json)], '\n'))
		return
	}
	v := tenantsView{Stats: snap.line, Refresh: c.o.Refresh.Milliseconds(), MaxRows: c.o.MaxTenantRows, Every: c.o.HistoryEvery.Milliseconds()}
	v.Plots = c.plots(snap.line.Tenants)
	v.Rows = slices.Clone(snap.line.Tenants)
	slices.SortStableFunc(v.Rows, func(a, b TenantStats) int {
		ta, tb := inTrouble(&a), inTrouble(&b)
		switch {
		case ta && !tb:
			return -1
		case tb && !ta:
			return 1
		}
		return 0
	})
	if len(v.Rows) > c.o.MaxTenantRows {
		v.Hidden = len(v.Rows) - c.o.MaxTenantRows
		v.Rows = v.Rows[:c.o.MaxTenantRows]
	}
	v.Events, v.EventSeq = c.events.since(0, pageEvents)
	slices.Reverse(v.Events)
	heading := "Tenants"
	if snap.line.Label != "" {
		heading += ": " + snap.line.Label
	}
	c.html(w, http.StatusOK, "tenants", c.page(r, "tenants", heading, v))
}

// live streams snapshots and events as server-sent events: GET /live.
// Each viewer reads the shared snapshot (one consumer.Stats per Refresh
// for all of them) and writes with no lock held, so a slow viewer slows
// only itself. ?after=SEQ starts the events after SEQ (default: now).
func (c *Console) live(w http.ResponseWriter, r *http.Request) {
	select {
	case c.streams <- struct{}{}:
		defer func() { <-c.streams }()
	default:
		w.Header().Set("Retry-After", "5")
		c.fail(w, r, "live", http.StatusServiceUnavailable, "too many live streams open (MaxStreams)")
		return
	}
	after := c.events.last()
	if s, err := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64); err == nil {
		after = min(s, after)
	}
	if s, err := strconv.ParseUint(r.Header.Get("Last-Event-ID"), 10, 64); err == nil {
		after = min(s, after)
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	ctx := r.Context()
	tick := time.NewTicker(c.o.Refresh)
	defer tick.Stop()
	var sent uint64
	buf := []byte("retry: 2000\n\n")
	for {
		snap := c.snaps.get(ctx)
		if snap.seq != sent {
			buf = append(buf, "event: stats\ndata: "...)
			buf = append(buf, snap.json...)
			buf = append(buf, "\n\n"...)
			sent = snap.seq
		}
		evs, last := c.events.since(after, streamEvents)
		for _, e := range evs {
			buf = append(buf, "id: "...)
			buf = strconv.AppendUint(buf, e.Seq, 10)
			buf = append(buf, "\nevent: log\ndata: "...)
			buf = appendJSON(buf, e)
			buf = append(buf, "\n\n"...)
		}
		after = last
		if len(buf) > 0 {
			_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
			if _, err := w.Write(buf); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			buf = buf[:0]
		}
		select {
		case <-ctx.Done():
			return
		case <-c.done:
			return
		case <-tick.C:
		}
	}
}

// log lists the kept engine events, newest first: GET /log.
func (c *Console) log(w http.ResponseWriter, r *http.Request) {
	evs, _ := c.events.since(0, 0)
	if wantJSON(r) {
		enc := jsonLines(w, http.StatusOK)
		for _, e := range evs {
			enc.Encode(e)
		}
		return
	}
	slices.Reverse(evs)
	c.html(w, http.StatusOK, "log", c.page(r, "log", "Engine events", evs))
}

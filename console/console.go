package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/fleet"
)

// Engine is what the tenant view reads: a *consumer.Consumer. Stats must
// take no lock for long and call no user code (consumer.Stats does both).
type Engine interface {
	Stats() consumer.Stats
}

// Options configure a Console. Zero fields mean the defaults written on
// each; New validates them.
type Options struct {
	// Engine is the running consumer whose tenants and partitions the
	// tenant view shows. Nil: no tenant view until SetEngine.
	Engine Engine
	// Label says which engine it is (e.g. "orders, kafka"); shown on the
	// page and in the JSON.
	Label string
	// DLQ browses, replays and purges dead letters. Nil: no DLQ pages
	// until SetDLQ.
	DLQ dlq.Inspector
	// Fleet holds the tables of the group the fleet page shows and
	// controls (package fleet). Nil: no fleet page until SetFleet.
	Fleet fleet.Store

	// Prefix is the path the console is mounted at; it starts and ends
	// with "/". Default "/". Mount the console there:
	// mux.Handle("/console/", c) with Prefix "/console/".
	Prefix string
	// Token authorizes replay and purge (Authorization: Bearer TOKEN, or
	// the session cookie that GET ?token=TOKEN sets). Empty: New makes a
	// random one; Token() returns it. At least 16 characters.
	Token string
	// ReadOnly hides replay and purge and refuses them (403).
	ReadOnly bool
	// Hosts are extra Host header values (without port) the console
	// answers. It always answers any Host when it is reached on a
	// non-loopback address, and only loopback names (localhost,
	// 127.0.0.0/8, [::1]) plus Hosts when reached on a loopback address:
	// a web page that rebinds its own name to 127.0.0.1 cannot read it.
	Hosts []string

	// Refresh is how old a snapshot of the engine may be before a viewer
	// triggers a new one, and how often live pages are updated: many
	// viewers cost one consumer.Stats per Refresh. Default 1s.
	Refresh time.Duration
	// MaxStreams bounds the live streams (GET /live) open at once; more
	// are refused with 503. Default 16.
	MaxStreams int
	// Events is how many recent engine events (from OnEvent) are kept.
	// Default 256.
	Events int
	// HistoryEvery is how often the console samples the engine for the
	// tenant plots (goodput and time lag over the last minutes): from the
	// moment an engine is attached until Close, one goroutine takes the
	// shared snapshot (one consumer.Stats, or a viewer's fresh one) every
	// HistoryEvery. Default 2s.
	HistoryEvery time.Duration
	// HistoryPoints is how many samples a tenant's plots keep. Default
	// 150 (five minutes at 2s).
	HistoryPoints int
	// HistoryTenants bounds the tenants that have plots: those worth
	// watching (breaker open or half-open, parked or spilling first, then
	// the largest backlog, then the most handled). Memory stays
	// HistoryTenants x HistoryPoints samples whatever the tenant count.
	// Default 8.
	HistoryTenants int
	// MaxTenantRows bounds the tenant rows an HTML page shows (those in
	// trouble first); the JSON has them all. Default 500.
	MaxTenantRows int
	// MaxPeek bounds the dead letters a tenant's DLQ page shows (?n=).
	// Default 100.
	MaxPeek int
	// MaxDLQCalls bounds the DLQ calls (list, peek, replay, purge) running
	// at once; more wait for their turn until their request ends.
	// Default 4.
	MaxDLQCalls int
	// MaxReplay is the most dead letters one replay moves. Default 100.
	MaxReplay int
	// ReplayRate is how many dead letters per second replays may move on
	// average (a token bucket of MaxReplay): a replay that would go past
	// it is refused with 429 and Retry-After. Default 10.
	ReplayRate float64
	// PurgeEvery is the least time between two purges. Default 10s.
	PurgeEvery time.Duration
	// Timeout bounds each DLQ call. Default 30s.
	Timeout time.Duration

	// Title heads every page. Default "ringfence console".
	Title string
	// Logger receives a line per replay and purge carried out, and the
	// errors of DLQ calls. Nil: slog.Default().
	Logger *slog.Logger
	// Now is the clock of the rate limits and snapshots. Nil: time.Now.
	Now func() time.Time
}

// ErrInvalidOptions: New was given unusable Options.
var ErrInvalidOptions = errors.New("console: invalid options")

// Defaults of Options.
const (
	defaultRefresh        = time.Second
	defaultMaxStreams     = 16
	defaultEvents         = 256
	defaultHistoryEvery   = 2 * time.Second
	defaultHistoryPoints  = 150
	defaultHistoryTenants = 8
	defaultMaxTenantRows  = 500
	defaultMaxPeek        = 100
	defaultMaxDLQCalls    = 4
	defaultMaxReplay      = 100
	defaultReplayRate     = 10
	defaultPurgeEvery     = 10 * time.Second
	defaultTimeout        = 30 * time.Second
	minTokenLen           = 16
)

func (o Options) resolve() (Options, error) {
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"Refresh", float64(o.Refresh)}, {"MaxStreams", float64(o.MaxStreams)}, {"Events", float64(o.Events)},
		{"HistoryEvery", float64(o.HistoryEvery)}, {"HistoryPoints", float64(o.HistoryPoints)},
		{"HistoryTenants", float64(o.HistoryTenants)}, {"MaxTenantRows", float64(o.MaxTenantRows)}, {"MaxPeek", float64(o.MaxPeek)},
		{"MaxDLQCalls", float64(o.MaxDLQCalls)}, {"MaxReplay", float64(o.MaxReplay)},
		{"ReplayRate", o.ReplayRate}, {"PurgeEvery", float64(o.PurgeEvery)}, {"Timeout", float64(o.Timeout)},
	} {
		if f.v < 0 {
			return o, fmt.Errorf("%w: %s must not be negative, got %v", ErrInvalidOptions, f.name, f.v)
		}
	}
	if o.Prefix == "" {
		o.Prefix = "/"
	}
	if !strings.HasPrefix(o.Prefix, "/") || !strings.HasSuffix(o.Prefix, "/") {
		return o, fmt.Errorf("%w: Prefix %q must start and end with /", ErrInvalidOptions, o.Prefix)
	}
	if o.Token == "" {
		var b [24]byte
		if _, err := rand.Read(b[:]); err != nil {
			return o, fmt.Errorf("console: token: %w", err)
		}
		o.Token = hex.EncodeToString(b[:])
	}
	if len(o.Token) < minTokenLen || strings.ContainsAny(o.Token, " \t\r\n") {
		return o, fmt.Errorf("%w: Token must be at least %d characters without spaces", ErrInvalidOptions, minTokenLen)
	}
	if o.Refresh == 0 {
		o.Refresh = defaultRefresh
	}
	o.MaxStreams = orInt(o.MaxStreams, defaultMaxStreams)
	o.Events = orInt(o.Events, defaultEvents)
	if o.HistoryEvery == 0 {
		o.HistoryEvery = defaultHistoryEvery
	}
	o.HistoryPoints = orInt(o.HistoryPoints, defaultHistoryPoints)
	o.HistoryTenants = orInt(o.HistoryTenants, defaultHistoryTenants)
	o.MaxTenantRows = orInt(o.MaxTenantRows, defaultMaxTenantRows)
	o.MaxPeek = orInt(o.MaxPeek, defaultMaxPeek)
	o.MaxDLQCalls = orInt(o.MaxDLQCalls, defaultMaxDLQCalls)
	o.MaxReplay = orInt(o.MaxReplay, defaultMaxReplay)
	if o.ReplayRate == 0 {
		o.ReplayRate = defaultReplayRate
	}
	if o.PurgeEvery == 0 {
		o.PurgeEvery = defaultPurgeEvery
	}
	if o.Timeout == 0 {
		o.Timeout = defaultTimeout
	}
	if o.Title == "" {
		o.Title = "ringfence console"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o, nil
}

func orInt(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

// Console is the ops console: an http.Handler serving the tenant view, the
// DLQ browser and their JSON API (see the package documentation). It is
// safe for concurrent use. With no request in progress it only samples the
// attached engine for the plots, every Options.HistoryEvery; with no engine
// it runs no goroutine and no timer.
type Console struct {
	o   Options
	mux *http.ServeMux

	engine atomic.Pointer[engineRef] // the engine shown; nil: none
	dlq    atomic.Pointer[dlqRef]    // the DLQ browsed; nil: none
	fleet  atomic.Pointer[fleetRef]  // the fleet shown; nil: none

	snaps  snapshots
	events eventLog
	hist   history

	streams chan struct{} // a slot per open live stream (MaxStreams)
	calls   chan struct{} // a slot per running DLQ call (MaxDLQCalls)
	acting  atomic.Bool   // a replay or purge is being carried out

	limMu    sync.Mutex    // guards replays and purges (leaf lock; no I/O under it)
	replays  *rate.Limiter // dead letters moved
	purges   *rate.Limiter // purges
	done     chan struct{} // closed by Close: live streams end
	doneOnce sync.Once
}

type engineRef struct {
	e     Engine
	label string
}

type dlqRef struct{ in dlq.Inspector }

// New returns a console for o.
func New(o Options) (*Console, error) {
	o, err := o.resolve()
	if err != nil {
		return nil, err
	}
	c := &Console{
		o:       o,
		streams: make(chan struct{}, o.MaxStreams),
		calls:   make(chan struct{}, o.MaxDLQCalls),
		replays: rate.NewLimiter(rate.Limit(o.ReplayRate), o.MaxReplay),
		purges:  rate.NewLimiter(rate.Every(o.PurgeEvery), 1),
		done:    make(chan struct{}),
	}
	c.events.init(o.Events)
	c.hist.max, c.hist.points = o.HistoryTenants, o.HistoryPoints
	c.snaps.c = c
	c.SetEngine(o.Engine, o.Label)
	c.SetDLQ(o.DLQ)
	c.SetFleet(o.Fleet)
	c.mux = c.routes()
	return c, nil
}

// Handler returns New(o) as an http.Handler, for mounting in one line like
// net/http/pprof. It panics if o is invalid; use New to handle the error
// or to reach Token, OnEvent, SetEngine and Close.
func Handler(o Options) http.Handler {
	c, err := New(o)
	if err != nil {
		panic(err)
	}
	return c
}

// Token returns the token that authorizes replay and purge.
func (c *Console) Token() string { return c.o.Token }

// SetEngine shows e (nil: none) under label from now on: a service that
// restarts its consumer, or the demo running one consumer per run, points
// the console at the new one. The plots start over with a new engine; the
// sampler (see Options.HistoryEvery) runs while one is attached, until
// Close.
func (c *Console) SetEngine(e Engine, label string) {
	if e == nil {
		c.engine.Store(nil)
		return
	}
	c.engine.Store(&engineRef{e: e, label: label})
	c.startSampling()
}

// SetDLQ browses in (nil: none) from now on.
func (c *Console) SetDLQ(in dlq.Inspector) {
	if in == nil {
		c.dlq.Store(nil)
		return
	}
	c.dlq.Store(&dlqRef{in: in})
}

// OnEvent records an engine event for the live event log; chain it into
// consumer.Config.OnEvent. It costs a short critical section on a ring
// buffer per event (no allocation, no I/O); retry events are counted by
// the engine's stats and not kept, so a message's retries cost a compare.
func (c *Console) OnEvent(e consumer.Event) {
	if e.Kind == consumer.EventRetried {
		return
	}
	c.events.add(c.o.Now(), e)
}

// Close ends the live streams (an http.Server's Shutdown waits for them
// otherwise) and the sampler. The console still answers other requests.
func (c *Console) Close() error {
	c.doneOnce.Do(func() { close(c.done) })
	return nil
}

// Serve serves the console on ln until ctx ends, then ends its live
// streams and shuts the server down (waiting up to 5s for requests in
// progress). It returns nil after a shutdown that ctx asked for.
func (c *Console) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           c,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(c.o.Logger.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	c.Close()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

// ServeHTTP serves the console's routes under Prefix.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
	if !c.hostAllowed(r) {
		http.Error(w, "console: this Host is not served (a loopback console answers loopback names only; see Options.Hosts)", http.StatusMisdirectedRequest)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, c.o.Prefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	r2 := new(http.Request)
	*r2 = *r
	u := *r.URL
	u.Path, u.RawPath = "/"+rest, ""
	r2.URL = &u
	c.mux.ServeHTTP(w, r2)
}

// hostAllowed refuses requests that reached a loopback listener under a
// name that is not loopback (DNS rebinding).
func (c *Console) hostAllowed(r *http.Request) bool {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return true
	}
	ta, ok := local.(*net.TCPAddr)
	if !ok || !ta.IP.IsLoopback() {
		return true
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, h := range c.o.Hosts {
		if strings.EqualFold(h, host) {
			return true
		}
	}
	return false
}

// Start listens on addr and serves the console in the background until ctx
// ends (see Serve). It returns the URL to open: with ?token= unless the
// console is read-only, so that opening it signs in.
func (c *Console) Start(ctx context.Context, addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("console: %w", err)
	}
	go func() {
		if err := c.Serve(ctx, ln); err != nil {
			c.o.Logger.Warn("console: server stopped", "err", err)
		}
	}()
	u := "http://" + ln.Addr().String() + c.o.Prefix
	if !c.o.ReadOnly {
		u += "?token=" + c.o.Token
	}
	return u, nil
}

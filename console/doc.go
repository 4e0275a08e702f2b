// Package console is an ops console for a running ringfence consumer and
// its dead-letter queues: a live tenant view and a DLQ browser, served from
// the binary by net/http and html/template (no JavaScript framework, no
// CDN), with a JSON API under the same routes.
//
// Mount it next to a service's own endpoints, like net/http/pprof:
//
//	con, err := console.New(console.Options{Prefix: "/console/", DLQ: inspector})
//	cfg.OnEvent = con.OnEvent // optional: the live event log
//	c, err := consumer.New(cfg)
//	con.SetEngine(c, "orders")
//	mux.Handle("/console/", con)
//
// or run it alone over a DLQ with `ringfence console`.
//
// # Cost
//
// The console does not touch the per-message path (OnEvent, if chained,
// copies an event into a ring under a leaf lock, looking back over at most
// 16 lines for a run to join; retry events are dropped at once). While an
// engine is attached, one goroutine samples it for the plots every
// Options.HistoryEvery (one consumer.Stats, or a viewer's fresh snapshot);
// with no engine it starts no goroutine and no timer. A viewer triggers at
// most one consumer.Stats per Options.Refresh, shared by every viewer and
// the sampler (Stats takes each partition's lock briefly, one at a time,
// and calls no user code); the console calls it with no lock of its own
// held and writes to viewers with no lock held, so a slow or stalled
// browser slows only its own stream.
//
// # Plots
//
// The tenant view draws, for the tenants worth watching, their goodput
// (messages handled per second) and time lag (age of the oldest unsettled
// message) over the last HistoryPoints x HistoryEvery (five minutes by
// default), as inline SVG rendered by the server, and says since when each
// breaker is open and how old the tenant's oldest message, oldest parked
// message and spill backlog are. Only HistoryTenants tenants (8 by
// default) have plots: those whose breaker is open or half-open, or that
// are parked or spilling, take the place of calm ones; free places go to
// the largest backlog, then the most handled. A watched tenant keeps its
// plot while the engine lists it, unless a tenant in trouble needs its
// place and it is calm. Memory stays HistoryTenants x HistoryPoints
// samples whatever the number of tenants.
//
// # Events
//
// Repeated events of one tenant are one line of the event log, with a
// count and the time of the first and last: an outage probed every few
// seconds is one "parked/resumed x36, 12:00:01-12:00:39" line, not
// seventy-two. An event joins the newest line of its tenant (for partition
// events: of its partition) among the 16 newest lines when that line is of
// the same class (parked and resumed; spilling and spill-drained;
// partition paused and resumed; dead letters of one reason; reorders of
// one reason; DLQ failures; spill failures; panics) and its last event is at most a minute old.
// Events of other tenants do not break a run (tenants that fail together
// interleave); an event of the same tenant in another class does (parked,
// dead-lettered, resumed stays three lines). The joined line moves to the
// newest place under a new seq, keeping its run id, so live viewers
// replace it.
//
// # Routes
//
// Paths are relative to Options.Prefix. Every GET answers HTML, or JSON
// Lines (Content-Type application/x-ndjson, one object per line, "type"
// first) with ?format=json or an Accept header asking for
// application/json.
//
//	GET  /                   tenant view: totals, plots of the watched tenants, tenants (breaker,
//	                         parked, queued, in flight, spilling, handled, failed, dead-lettered,
//	                         latency, commit lag, open for, time lag, oldest parked, spill
//	                         backlog age), partitions (paused, queued, unsettled, commit lag,
//	                         oldest), events. JSON: one StatsLine.
//	GET  /plots              the watched tenants' plots. JSON: one PlotLine per watched tenant.
//	GET  /live               server-sent events: "stats" (a StatsLine) each Refresh, "log"
//	                         (an EventLine, id = its seq) per new event.
//	                         ?after=SEQ or Last-Event-ID resumes the events.
//	GET  /log                the kept engine events, runs collapsed. JSON: EventLines, oldest first.
//	GET  /dlq                tenants with dead letters. JSON: TenantLines (as `ringfence dlq ls --json`).
//	GET  /dlq/{token}        a tenant's oldest dead letters (?n=, at most MaxPeek), with headers
//	                         and the value as text and hex. JSON: RecordLines (as `ringfence dlq
//	                         peek --json`; ?raw=1 keeps whole values in "text").
//	POST /dlq/{token}/replay dry_run=1&limit=N: what a replay of the oldest N would move
//	                         (RecordLines, a ReplayLine with dry_run true, a ConfirmLine);
//	                         expect=E&limit=N: move them (RecordLines, a ReplayLine).
//	POST /dlq/{token}/purge  dry_run=1: what a purge would remove (a TenantLine, a ConfirmLine);
//	                         expect=E: remove them (a PurgeLine).
//	GET  /fleet              with Options.Fleet: the group's live processes, partition owners,
//	                         tenants not healthy and active controls (package fleet). JSON:
//	                         FleetProcessLines, FleetPartitionLines, FleetTenantLines,
//	                         FleetControlLines (as `ringfence status --json`).
//	POST /fleet/control      verb=hold|release|quarantine|unquarantine|open|close|auto,
//	                         reason=TEXT, tenant_token=T (or tenant=KEY): writes the tenant's
//	                         control record, which every process applies (a FleetControlLine).
//	GET  /static/...         the style sheet and live.js.
//
// Tenants are addressed by token (dlq.TenantToken of the raw key), never by
// raw key: any key, however hostile, is a path segment of [A-Za-z0-9._-].
// A hashed token (for a very long key) is resolved among the tenants the
// DLQ lists. Errors are an ErrorLine with the HTTP status: 400 bad input,
// 403 refused, 404 unknown, 409 changed since the dry run or another action
// running, 429 rate limited (Retry-After), 502 the DLQ failed, 503 too many
// live streams.
//
// # Security
//
// Reading is open to whoever reaches the console, as with pprof: bind it to
// loopback (the command's default) or behind the service's own
// authentication. A console reached on a loopback address answers only
// loopback Host names (and Options.Hosts), so a web page that rebinds its
// name to 127.0.0.1 cannot read it. Every answer forbids framing, inline
// scripts and outside resources (Content-Security-Policy), and every tenant
// key, header and value is escaped by html/template after Printable made
// control bytes and invalid UTF-8 visible.
//
// Replay and purge change the DLQ, so they are POST-only and need the
// token (Options.Token, or a random one from Token()): either
// Authorization: Bearer TOKEN (scripts), or the session cookie that
// GET ?token=TOKEN sets (HttpOnly, SameSite=Strict, holding a value derived
// from the token, not the token) together with the page's CSRF field.
// Cross-origin browser POSTs are refused first (http.CrossOriginProtection).
// Each action is a dry run first, showing what it would touch; carrying it
// out needs the dry run's expect value and is refused (409) if the DLQ no
// longer holds the same dead letters. Replays are rate-limited like SQS
// redrive (MaxReplay at once, ReplayRate per second on average), purges to
// one per PurgeEvery, and one action runs at a time. ReadOnly hides and
// refuses both. Fleet controls take the same token and CSRF field, and a
// reason, which is kept with the control.
package console

package console

// The fleet page: the group's processes, partition owners, tenants not
// healthy across processes and the active controls (package fleet), with
// hold, release, quarantine, open and close buttons that write a control
// record.

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/fleet"
)

type fleetRef struct{ st fleet.Store }

// SetFleet shows the group whose tables st holds (nil: no fleet page)
// from now on.
func (c *Console) SetFleet(st fleet.Store) {
	if st == nil {
		c.fleet.Store(nil)
		return
	}
	c.fleet.Store(&fleetRef{st: st})
}

// JSON Lines of GET /fleet (and of `ringfence status --json`).
type (
	// FleetProcessLine is one live process.
	FleetProcessLine struct {
		Type       string       `json:"type"` // "process"
		Process    string       `json:"process"`
		Group      string       `json:"group"`
		Source     string       `json:"source,omitempty"`
		UpdatedAt  time.Time    `json:"updated_at"`
		TTLSeconds float64      `json:"ttl_s"`
		Partitions []string     `json:"partitions"`
		Counts     fleet.Counts `json:"counts"`
	}
	// FleetPartitionLine is one partition and the processes reporting it.
	FleetPartitionLine struct {
		Type      string   `json:"type"` // "partition"
		Partition string   `json:"partition"`
		Owners    []string `json:"owners"`
	}
	// FleetTenantLine is one tenant not healthy somewhere.
	FleetTenantLine struct {
		Type    string            `json:"type"` // "tenant"
		Tenant  Tenant            `json:"tenant"`
		On      []FleetTenantOn   `json:"on"`
		Control *FleetControlLine `json:"control,omitempty"`
	}
	// FleetTenantOn is what one process reports of a tenant.
	FleetTenantOn struct {
		Process        string         `json:"process"`
		State          string         `json:"state"`
		RetryAt        time.Time      `json:"retry_at,omitzero"`
		Parked         int            `json:"parked"`
		Spilling       int            `json:"spilling"`
		Lag            int64          `json:"lag"`
		OldestSeconds  float64        `json:"oldest_s"`
		Held           bool           `json:"held"`
		DLQUnavailable bool           `json:"dlq_unavailable"`
		Control        *fleet.Control `json:"control,omitempty"`
	}
	// FleetControlLine is an active control.
	FleetControlLine struct {
		Type    string        `json:"type,omitempty"` // "control" (top level)
		Tenant  *Tenant       `json:"tenant,omitempty"`
		Control fleet.Control `json:"set"`
		Text    string        `json:"text"` // e.g. "hold,breaker=open"
		By      string        `json:"by"`
		At      time.Time     `json:"at"`
		Reason  string        `json:"reason"`
	}
)

func fleetControlLine(r fleet.ControlRecord, top bool) *FleetControlLine {
	l := &FleetControlLine{Control: r.Control, Text: r.Control.String(), By: r.By, At: r.At.UTC(), Reason: r.Reason}
	if top {
		t := TenantOf(r.Tenant)
		l.Type, l.Tenant = "control", &t
	}
	return l
}

// FleetLines returns the JSON Lines of a fleet view, in order: processes,
// partitions, tenants, controls.
func FleetLines(v fleet.View) []any {
	var out []any
	for _, s := range v.Processes {
		ps := s.Partitions
		if ps == nil {
			ps = []string{}
		}
		out = append(out, FleetProcessLine{Type: "process", Process: s.Process, Group: s.Group, Source: s.Source,
			UpdatedAt: s.UpdatedAt.UTC(), TTLSeconds: s.TTL.Seconds(), Partitions: ps, Counts: s.Counts})
	}
	for _, p := range v.Partitions {
		out = append(out, FleetPartitionLine{Type: "partition", Partition: p.Partition, Owners: p.Owners})
	}
	for _, t := range v.Tenants {
		l := FleetTenantLine{Type: "tenant", Tenant: TenantOf(t.Tenant)}
		for _, o := range t.On {
			l.On = append(l.On, FleetTenantOn{Process: o.Process, State: o.State, RetryAt: o.RetryAt.UTC(), Parked: o.Parked,
				Spilling: o.Spilling, Lag: o.Lag, OldestSeconds: o.OldestAge.Seconds(), Held: o.Held, DLQUnavailable: o.DLQUnavailable, Control: o.Control})
		}
		if t.Control != nil {
			l.Control = fleetControlLine(*t.Control, false)
		}
		out = append(out, l)
	}
	for _, r := range v.Controls {
		out = append(out, fleetControlLine(r, true))
	}
	return out
}

// fleetView is the fleet page's body.
type fleetView struct {
	Processes  []fleet.Status
	Partitions []fleet.PartitionOwners
	Tenants    []fleetTenantRow
	Controls   []fleetControlRow
	Omitted    int
	Now        time.Time
}

type fleetTenantRow struct {
	Tenant  Tenant
	On      []fleet.ProcessTenant
	Control string
}

type fleetControlRow struct {
	Tenant Tenant
	fleet.ControlRecord
	Text string
}

// readFleet reads the group's tables, within the DLQ call bounds.
func (c *Console) readFleet(ctx context.Context, st fleet.Store) (view fleet.View, controls map[string]fleet.ControlRecord, err error) {
	err = c.call(ctx, func(ctx context.Context) error {
		ss, err := fleet.ReadStatuses(ctx, st, c.o.Now(), c.o.Logger)
		if err != nil {
			return err
		}
		if controls, err = fleet.ReadControls(ctx, st, c.o.Logger); err != nil {
			return err
		}
		view = fleet.NewView(ss, controls)
		return nil
	})
	return view, controls, err
}

// fleetPage shows the fleet: GET /fleet.
func (c *Console) fleetPage(w http.ResponseWriter, r *http.Request) {
	ref := c.fleet.Load()
	if ref == nil {
		c.fail(w, r, "fleet", http.StatusNotFound, "no fleet is attached to this console")
		return
	}
	view, _, err := c.readFleet(r.Context(), ref.st)
	if err != nil {
		c.fail(w, r, "fleet", http.StatusBadGateway, err.Error())
		return
	}
	if wantJSON(r) {
		enc := jsonLines(w, http.StatusOK)
		for _, l := range FleetLines(view) {
			enc.Encode(l)
		}
		return
	}
	v := fleetView{Processes: view.Processes, Partitions: view.Partitions, Now: c.o.Now()}
	for _, t := range view.Tenants {
		row := fleetTenantRow{Tenant: TenantOf(t.Tenant), On: t.On}
		if t.Control != nil {
			row.Control = t.Control.Control.String()
		}
		v.Tenants = append(v.Tenants, row)
	}
	for _, r := range view.Controls {
		v.Controls = append(v.Controls, fleetControlRow{Tenant: TenantOf(r.Tenant), ControlRecord: r, Text: r.Control.String()})
	}
	for _, s := range view.Processes {
		v.Omitted += s.Counts.Omitted
	}
	p := c.page(r, "fleet", "Fleet", v)
	if s := r.URL.Query().Get("done"); s != "" {
		p.Flash = s
	}
	c.html(w, http.StatusOK, "fleet", p)
}

// fleetAct is what a tenant row's control form needs.
type fleetAct struct{ Base, CSRF, Token string }

// consoleVerbs are the verbs the fleet page's buttons send.
var consoleVerbs = []string{"hold", "release", "quarantine", "unquarantine", "open", "close", "auto"}

// fleetControl writes a control record: POST /fleet/control with verb,
// reason, and tenant_token (as the page shows it) or tenant (a raw key).
func (c *Console) fleetControl(w http.ResponseWriter, r *http.Request) {
	const cmd = "control"
	if !c.guardAction(w, r, cmd) {
		return
	}
	ref := c.fleet.Load()
	if ref == nil {
		c.fail(w, r, cmd, http.StatusNotFound, "no fleet is attached to this console")
		return
	}
	verb, reason := r.PostFormValue("verb"), strings.TrimSpace(r.PostFormValue("reason"))
	token, raw := r.PostFormValue("tenant_token"), r.PostFormValue("tenant")
	switch {
	case !slices.Contains(consoleVerbs, verb):
		c.fail(w, r, cmd, http.StatusBadRequest, fmt.Sprintf("verb must be one of %v", consoleVerbs))
		return
	case reason == "":
		c.fail(w, r, cmd, http.StatusBadRequest, "a reason is required (it is kept with the control)")
		return
	case len(reason) > 1024:
		c.fail(w, r, cmd, http.StatusBadRequest, "the reason is longer than 1024 bytes")
		return
	case (token == "") == (raw == ""):
		c.fail(w, r, cmd, http.StatusBadRequest, "give tenant_token or tenant (one of them)")
		return
	}
	tenant, exact := raw, true
	if token != "" {
		var err error
		if tenant, exact, err = dlq.ParseTenantToken(token); err != nil {
			c.fail(w, r, cmd, http.StatusBadRequest, err.Error())
			return
		}
	}
	view, controls, err := c.readFleet(r.Context(), ref.st)
	if err != nil {
		c.fail(w, r, cmd, http.StatusBadGateway, err.Error())
		return
	}
	if !exact {
		found := false
		for _, t := range view.Tenants {
			if dlq.TenantToken(t.Tenant) == token {
				tenant, found = t.Tenant, true
			}
		}
		for t := range controls {
			if dlq.TenantToken(t) == token {
				tenant, found = t, true
			}
		}
		if !found {
			c.fail(w, r, cmd, http.StatusNotFound, "the hashed token names no tenant the fleet knows; give the raw tenant")
			return
		}
	}
	rec := controls[tenant]
	rec.Tenant, rec.Reason, rec.At, rec.By = tenant, reason, c.o.Now().UTC(), "console"
	if ra := r.RemoteAddr; ra != "" {
		rec.By = "console (" + ra + ")"
	}
	rec.Control, _ = rec.Control.Apply(verb, 0)
	err = c.call(r.Context(), func(ctx context.Context) error { return fleet.WriteControl(ctx, ref.st, rec) })
	c.o.Logger.Info("console: tenant control written", "tenant", Printable(tenant, keyTextLimit), "verb", verb, "control", rec.Control.String(), "reason", reason, "err", err)
	if err != nil {
		c.fail(w, r, cmd, http.StatusBadGateway, err.Error())
		return
	}
	if wantJSON(r) {
		jsonLines(w, http.StatusOK).Encode(fleetControlLine(rec, true))
		return
	}
	done := fmt.Sprintf("%s: %s (%s)", verb, Printable(tenant, keyTextLimit), rec.Control.String())
	http.Redirect(w, r, c.o.Prefix+"fleet?done="+url.QueryEscape(done), http.StatusSeeOther)
}

package console

// The DLQ pages and their actions (peek, dry run, confirm, replay, purge)
// share one flow of checks (token, CSRF, expect, rate limit), kept in one
// file so that the flow reads top to bottom: hence its length.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"golang.org/x/time/rate"

	"github.com/ringfence/ringfence/dlq"
)

// errNoTenant: a token names no tenant with dead letters.
var errNoTenant = errors.New("console: no dead letters for this tenant token")

func appendJSON(b []byte, v any) []byte {
	j, err := json.Marshal(v)
	if err != nil {
		return append(b, `{"type":"error","error":"encoding failed"}`...)
	}
	return append(b, j...)
}

// inspector returns the DLQ browsed, or answers 404.
func (c *Console) inspector(w http.ResponseWriter, r *http.Request, cmd string) dlq.Inspector {
	ref := c.dlq.Load()
	if ref == nil {
		c.fail(w, r, cmd, http.StatusNotFound, "no DLQ is attached to this console")
		return nil
	}
	return ref.in
}

// call runs fn against the DLQ in one of MaxDLQCalls slots, within Timeout.
func (c *Console) call(ctx context.Context, fn func(ctx context.Context) error) error {
	select {
	case c.calls <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.calls }()
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	return fn(ctx)
}

// dlqFailed answers a failed DLQ call with 502 (the DLQ's fault) and logs
// it.
func (c *Console) dlqFailed(w http.ResponseWriter, r *http.Request, cmd string, err error) {
	c.o.Logger.Warn("console: DLQ call failed", "command", cmd, "err", err)
	c.fail(w, r, cmd, http.StatusBadGateway, "DLQ: "+err.Error())
}

// dlqList lists the tenants with dead letters: GET /dlq.
func (c *Console) dlqList(w http.ResponseWriter, r *http.Request) {
	in := c.inspector(w, r, "ls")
	if in == nil {
		return
	}
	var ts []dlq.TenantSummary
	err := c.call(r.Context(), func(ctx context.Context) (err error) {
		ts, err = in.Tenants(ctx)
		return err
	})
	if err != nil {
		c.dlqFailed(w, r, "ls", err)
		return
	}
	lines := make([]TenantLine, 0, len(ts))
	for _, t := range ts {
		lines = append(lines, TenantLineOf(t))
	}
	if wantJSON(r) {
		enc := jsonLines(w, http.StatusOK)
		for _, l := range lines {
			enc.Encode(l)
		}
		return
	}
	c.html(w, http.StatusOK, "dlq", c.page(r, "dlq", "Dead letters", lines))
}

// find resolves a tenant token to its raw key and summary. A hashed token
// is found among the listed tenants only; sum is nil when the tenant has
// no dead letters.
func (c *Console) find(ctx context.Context, in dlq.Inspector, token string) (tenant string, sum *dlq.TenantSummary, err error) {
	key, exact, err := dlq.ParseTenantToken(token)
	if err != nil {
		return "", nil, err
	}
	var ts []dlq.TenantSummary
	err = c.call(ctx, func(ctx context.Context) (err error) {
		ts, err = in.Tenants(ctx)
		return err
	})
	if err != nil {
		return "", nil, err
	}
	for i := range ts {
		if ts[i].Token == token {
			return ts[i].Tenant, &ts[i], nil
		}
	}
	if !exact {
		return "", nil, errNoTenant
	}
	return key, nil, nil
}

// tenantDLQView is a tenant's DLQ page.
type tenantDLQView struct {
	Tenant  Tenant
	Summary *TenantLine
	Records []recordView
	Reasons []reasonCount // among the records shown
	N       int           // how many were asked for
	More    bool          // the tenant has more than shown
	Limit   int           // MaxReplay
}

type reasonCount struct {
	Reason string
	Count  int
}

// recordView is a dead letter as the page shows it.
type recordView struct {
	RecordLine
	Where     string
	ValueText string
	ValueLen  int
	TextCut   bool
	Hex       string
	HexCut    bool
}

func recordViewOf(r dlq.Record) recordView {
	v := recordView{RecordLine: RecordLineOf(r, true), ValueLen: len(r.Value)}
	if r.Stream != "" {
		v.Where = fmt.Sprintf("stream %s, sequence %d", r.Stream, r.Sequence)
	} else {
		v.Where = fmt.Sprintf("partition %d, offset %d", r.Partition, r.Offset)
	}
	v.ValueText = Printable(string(r.Value), valueTextLimit)
	v.TextCut = len(v.ValueText) != len(v.Value.Text)
	hb := r.Value
	if len(hb) > hexLimit {
		hb, v.HexCut = hb[:hexLimit], true
	}
	v.Hex = hexDump(hb)
	return v
}

// peekN reads ?n= (default and most: MaxPeek).
func (c *Console) peekN(r *http.Request) (int, error) {
	s := r.URL.Query().Get("n")
	if s == "" {
		return c.o.MaxPeek, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > c.o.MaxPeek {
		return 0, fmt.Errorf("n must be a number from 1 to %d", c.o.MaxPeek)
	}
	return n, nil
}

// dlqTenant shows a tenant's oldest dead letters: GET /dlq/{token}.
func (c *Console) dlqTenant(w http.ResponseWriter, r *http.Request) {
	in := c.inspector(w, r, "peek")
	if in == nil {
		return
	}
	token := r.PathValue("token")
	n, err := c.peekN(r)
	if err != nil {
		c.fail(w, r, "peek", http.StatusBadRequest, err.Error())
		return
	}
	tenant, sum, err := c.find(r.Context(), in, token)
	switch {
	case errors.Is(err, errNoTenant):
		// A hashed token of a tenant that has no dead letters: nothing to
		// show, as for any other tenant without dead letters.
	case err != nil && errors.Is(err, dlq.ErrInvalidToken):
		c.fail(w, r, "peek", http.StatusNotFound, err.Error())
		return
	case err != nil:
		c.dlqFailed(w, r, "peek", err)
		return
	}
	var recs []dlq.Record
	if sum != nil {
		err = c.call(r.Context(), func(ctx context.Context) (err error) {
			recs, err = in.Peek(ctx, tenant, n+1)
			return err
		})
		if err != nil {
			c.dlqFailed(w, r, "peek", err)
			return
		}
	}
	more := len(recs) > n
	recs = recs[:min(len(recs), n)]
	if wantJSON(r) {
		raw := r.URL.Query().Get("raw") == "1"
		enc := jsonLines(w, http.StatusOK)
		for _, rec := range recs {
			enc.Encode(RecordLineOf(rec, raw))
		}
		return
	}
	v := tenantDLQView{Tenant: TenantOf(tenant), N: n, More: more, Limit: c.o.MaxReplay}
	if errors.Is(err, errNoTenant) {
		v.Tenant = Tenant{Key: "(unknown: hashed token " + token + ")", Token: token}
	}
	if sum != nil {
		l := TenantLineOf(*sum)
		v.Summary = &l
	}
	counts := map[string]int{}
	for _, rec := range recs {
		v.Records = append(v.Records, recordViewOf(rec))
		counts[string(rec.Reason)]++
	}
	for reason, n := range counts {
		v.Reasons = append(v.Reasons, reasonCount{reason, n})
	}
	slices.SortFunc(v.Reasons, func(a, b reasonCount) int { return b.Count - a.Count })
	p := c.page(r, "dlq", "Dead letters of "+tenantLabel(v.Tenant), v)
	q := r.URL.Query()
	if s := q.Get("replayed"); s != "" {
		p.Flash = "Replayed " + s + " dead letter(s) to their source."
	}
	if s := q.Get("purged"); s != "" {
		p.Flash = "Purged " + s + " dead letter(s)."
	}
	c.html(w, http.StatusOK, "tenant", p)
}

func tenantLabel(t Tenant) string {
	if t.NoTenant {
		return "(no tenant)"
	}
	return cut(t.Key, keyTextLimit)
}

// digest names what a dry run showed, so that carrying the action out can
// check that the DLQ still holds the same: the action, the tenant, and the
// dead letters (their IDs, or positions when they have none) with, for a
// purge, the tenant's counts.
func digest(action, tenant string, limit int, sum *dlq.TenantSummary, recs []dlq.Record) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%q\x00%d\x00", action, tenant, limit)
	if sum != nil {
		fmt.Fprintf(h, "%d %d %d %d\x00", sum.Count, sum.Records, sum.Oldest.UnixNano(), sum.Newest.UnixNano())
	}
	for _, r := range recs {
		if id, ok := r.ID(); ok {
			fmt.Fprintf(h, "%s\x00", id)
		} else {
			fmt.Fprintf(h, "@%d\x00", r.Position)
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// actionForm is what replay and purge read from their POST.
type actionForm struct {
	dry    bool
	expect string
	limit  int
}

func (c *Console) actionForm(r *http.Request, action string) (actionForm, error) {
	f := actionForm{expect: r.PostFormValue("expect")}
	switch r.PostFormValue("dry_run") {
	case "1", "true", "on":
		f.dry = true
	case "", "0", "false":
	default:
		return f, errors.New("dry_run must be 1 or 0")
	}
	if !f.dry && f.expect == "" {
		return f, fmt.Errorf("a %s needs a dry run first: POST dry_run=1, then the same with expect=<the dry run's expect> to carry it out", action)
	}
	if action == "replay" {
		s := r.PostFormValue("limit")
		n, err := strconv.Atoi(s)
		if s == "" {
			n, err = 1, nil
		}
		if err != nil || n < 1 || n > c.o.MaxReplay {
			return f, fmt.Errorf("limit must be a number from 1 to %d (MaxReplay)", c.o.MaxReplay)
		}
		f.limit = n
	}
	return f, nil
}

// target is what a replay or purge acts on: the request's form and the
// tenant its path token names.
type target struct {
	in     dlq.Inspector
	form   actionForm
	token  string
	tenant string
	sum    *dlq.TenantSummary // nil when the tenant has no dead letters
}

// startAction runs the checks a replay or purge begins with, in order: the
// guard, an attached DLQ, the form, the tenant token. It answers and
// returns false at the first that fails.
func (c *Console) startAction(w http.ResponseWriter, r *http.Request, action string) (target, bool) {
	if !c.guardAction(w, r, action) {
		return target{}, false
	}
	in := c.inspector(w, r, action)
	if in == nil {
		return target{}, false
	}
	f, err := c.actionForm(r, action)
	if err != nil {
		c.fail(w, r, action, http.StatusBadRequest, err.Error())
		return target{}, false
	}
	t := target{in: in, form: f, token: r.PathValue("token")}
	t.tenant, t.sum, err = c.find(r.Context(), in, t.token)
	if err != nil {
		c.findFailed(w, r, action, err)
		return target{}, false
	}
	return t, true
}

// guardAction answers and returns false unless a replay or purge may go
// on: not read-only, and authorized.
func (c *Console) guardAction(w http.ResponseWriter, r *http.Request, action string) bool {
	if c.o.ReadOnly {
		c.fail(w, r, action, http.StatusForbidden, "this console is read-only")
		return false
	}
	if !c.authorized(r) {
		c.fail(w, r, action, http.StatusForbidden, action+" needs the console's token: Authorization: Bearer TOKEN, or the session (open the console's URL with ?token=TOKEN) and the form's csrf field")
		return false
	}
	return true
}

// confirmView is the confirm page of a dry run.
type confirmView struct {
	Action  string // "replay" or "purge"
	Tenant  Tenant
	Summary *TenantLine
	Records []recordView
	Count   int
	Limit   int
	Expect  string
	Changed bool // the DLQ changed since the dry run the user confirmed
}

// replay moves a tenant's oldest dead letters back to their source: POST
// /dlq/{token}/replay with dry_run=1 and limit=N first, then with
// expect=<the dry run's expect>.
func (c *Console) replay(w http.ResponseWriter, r *http.Request) {
	t, ok := c.startAction(w, r, "replay")
	if !ok {
		return
	}
	var would []dlq.Record
	err := c.call(r.Context(), func(ctx context.Context) (err error) {
		would, err = t.in.Replay(ctx, t.tenant, dlq.ReplayOptions{Limit: t.form.limit, DryRun: true})
		return err
	})
	if err != nil {
		c.dlqFailed(w, r, "replay", err)
		return
	}
	sum := digest("replay", t.tenant, t.form.limit, nil, would)
	changed := !t.form.dry && !equal(t.form.expect, sum)
	if t.form.dry || changed {
		c.confirm(w, r, confirmView{Action: "replay", Tenant: TenantOf(t.tenant), Count: len(would), Limit: t.form.limit, Expect: sum, Changed: changed}, would)
		return
	}
	if len(would) > 0 {
		if wait, ok := c.take(c.replays, len(would)); !ok {
			c.tooSoon(w, r, "replay", wait, fmt.Sprintf("replays may move %v dead letters per second on average (ReplayRate), up to %d at once", c.o.ReplayRate, c.o.MaxReplay))
			return
		}
	}
	if !c.acting.CompareAndSwap(false, true) {
		c.fail(w, r, "replay", http.StatusConflict, "another replay or purge is being carried out; try again when it is done")
		return
	}
	var moved []dlq.Record
	err = c.call(r.Context(), func(ctx context.Context) (err error) {
		moved, err = t.in.Replay(ctx, t.tenant, dlq.ReplayOptions{Limit: t.form.limit})
		return err
	})
	c.acting.Store(false)
	c.o.Logger.Info("console: replayed dead letters", "tenant", Printable(t.tenant, keyTextLimit), "token", t.token, "moved", len(moved), "err", err)
	if err != nil {
		c.dlqFailed(w, r, "replay", fmt.Errorf("%w (%d dead letter(s) moved before it failed)", err, len(moved)))
		return
	}
	if wantJSON(r) {
		enc := jsonLines(w, http.StatusOK)
		for _, rec := range moved {
			enc.Encode(RecordLineOf(rec, false))
		}
		enc.Encode(ReplayLine{Type: "replay", Tenant: TenantOf(t.tenant), Moved: len(moved)})
		return
	}
	http.Redirect(w, r, c.o.Prefix+"dlq/"+url.PathEscape(t.token)+"?replayed="+strconv.Itoa(len(moved)), http.StatusSeeOther)
}

// purge removes all of a tenant's dead letters: POST /dlq/{token}/purge
// with dry_run=1 first, then with expect=<the dry run's expect>.
func (c *Console) purge(w http.ResponseWriter, r *http.Request) {
	t, ok := c.startAction(w, r, "purge")
	if !ok {
		return
	}
	var (
		sample []dlq.Record
		err    error
	)
	if t.sum != nil {
		err = c.call(r.Context(), func(ctx context.Context) (err error) {
			sample, err = t.in.Peek(ctx, t.tenant, c.o.MaxPeek)
			return err
		})
		if err != nil {
			c.dlqFailed(w, r, "purge", err)
			return
		}
	}
	d := digest("purge", t.tenant, 0, t.sum, sample)
	changed := !t.form.dry && !equal(t.form.expect, d)
	if t.form.dry || changed {
		v := confirmView{Action: "purge", Tenant: TenantOf(t.tenant), Expect: d, Changed: changed}
		if t.sum != nil {
			l := TenantLineOf(*t.sum)
			v.Summary, v.Count = &l, t.sum.Count
		}
		c.confirm(w, r, v, sample)
		return
	}
	if wait, ok := c.take(c.purges, 1); !ok {
		c.tooSoon(w, r, "purge", wait, fmt.Sprintf("one purge per %v (PurgeEvery)", c.o.PurgeEvery))
		return
	}
	if !c.acting.CompareAndSwap(false, true) {
		c.fail(w, r, "purge", http.StatusConflict, "another replay or purge is being carried out; try again when it is done")
		return
	}
	var n int
	err = c.call(r.Context(), func(ctx context.Context) (err error) {
		n, err = t.in.Purge(ctx, t.tenant)
		return err
	})
	c.acting.Store(false)
	c.o.Logger.Info("console: purged dead letters", "tenant", Printable(t.tenant, keyTextLimit), "token", t.token, "purged", n, "err", err)
	if err != nil {
		c.dlqFailed(w, r, "purge", err)
		return
	}
	if wantJSON(r) {
		jsonLines(w, http.StatusOK).Encode(PurgeLine{Type: "purge", Tenant: TenantOf(t.tenant), Purged: n})
		return
	}
	http.Redirect(w, r, c.o.Prefix+"dlq/"+url.PathEscape(t.token)+"?purged="+strconv.Itoa(n), http.StatusSeeOther)
}

// findFailed answers a failed token lookup.
func (c *Console) findFailed(w http.ResponseWriter, r *http.Request, cmd string, err error) {
	switch {
	case errors.Is(err, errNoTenant), errors.Is(err, dlq.ErrInvalidToken):
		c.fail(w, r, cmd, http.StatusNotFound, err.Error())
	default:
		c.dlqFailed(w, r, cmd, err)
	}
}

// confirm answers a dry run (or a confirmation the DLQ no longer matches:
// 409) with what the action would touch and how to carry it out.
func (c *Console) confirm(w http.ResponseWriter, r *http.Request, v confirmView, recs []dlq.Record) {
	status := http.StatusOK
	if v.Changed {
		status = http.StatusConflict
	}
	if v.Action == "replay" {
		v.Count = len(recs)
	}
	if wantJSON(r) {
		enc := jsonLines(w, status)
		if v.Changed {
			enc.Encode(ErrorLine{Type: "error", Command: v.Action, Error: "the dead letters changed since the dry run; nothing was done. Review this dry run and confirm again with its expect"})
		}
		tenant := v.Tenant
		if v.Action == "replay" {
			for _, rec := range recs {
				enc.Encode(RecordLineOf(rec, false))
			}
			enc.Encode(ReplayLine{Type: "replay", Tenant: tenant, DryRun: true, Moved: len(recs)})
		} else if v.Summary != nil {
			enc.Encode(*v.Summary)
		}
		enc.Encode(ConfirmLine{Type: "confirm", Action: v.Action, Tenant: tenant, Count: v.Count, Limit: v.Limit, Expect: v.Expect})
		return
	}
	for _, rec := range recs {
		v.Records = append(v.Records, recordViewOf(rec))
	}
	heading := "Replay dead letters of " + tenantLabel(v.Tenant)
	if v.Action == "purge" {
		heading = "Purge dead letters of " + tenantLabel(v.Tenant)
	}
	p := c.page(r, "dlq", heading, v)
	p.CSRF = c.csrfToken() // the POST was authorized; its confirm form needs it
	if v.Changed {
		p.Warning = "The dead letters changed since your dry run, so nothing was done. Here is what the " + v.Action + " would touch now."
	}
	c.html(w, status, "confirm", p)
}

// take takes n tokens from lim now, or says how long until it could
// (taking none).
func (c *Console) take(lim *rate.Limiter, n int) (time.Duration, bool) {
	c.limMu.Lock()
	defer c.limMu.Unlock()
	now := c.o.Now()
	res := lim.ReserveN(now, n)
	if !res.OK() {
		return time.Minute, false
	}
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return d, false
	}
	return 0, true
}

// tooSoon answers 429 with Retry-After.
func (c *Console) tooSoon(w http.ResponseWriter, r *http.Request, cmd string, wait time.Duration, why string) {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
	c.fail(w, r, cmd, http.StatusTooManyRequests, fmt.Sprintf("rate limited: %s; try again in %v", why, wait.Round(time.Second)))
}

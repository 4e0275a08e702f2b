package console

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"
)

//go:embed assets
var assets embed.FS

// staticFS is what /static/ serves: the style sheet and the live script.
var staticFS = func() fs.FS {
	sub, err := fs.Sub(assets, "assets/static")
	if err != nil {
		panic(err)
	}
	return sub
}()

// Display bounds of the HTML pages (the JSON API is whole).
const (
	keyTextLimit   = 120  // runes of a tenant key in tables
	valueTextLimit = 4096 // runes of a value shown as text
	hexLimit       = 4096 // bytes of a value shown as hex
	pageEvents     = 20   // recent events on the tenant view
)

var pages = template.Must(template.New("pages").Funcs(template.FuncMap{
	"dur":   durText,
	"age":   ageText,
	"clock": clockText,
	"add":   func(a, b int) int { return a + b },
	"int64": func(d time.Duration) int64 { return int64(d) },
	"fleetAct": func(p *page, token string) fleetAct {
		return fleetAct{Base: p.Base, CSRF: p.CSRF, Token: token}
	},
	"kinds":          func(k []string) string { return strings.Join(k, "/") },
	"stamp":          stamp,
	"short":          func(s string) string { return cut(s, keyTextLimit) },
	"trouble":        func(t TenantStats) bool { return inTrouble(&t) },
	"valueTextLimit": func() int { return valueTextLimit },
	"hexLimit":       func() int { return hexLimit },
	"tenantName": func(t Tenant) string {
		if t.NoTenant {
			return "(no tenant)"
		}
		return cut(t.Key, keyTextLimit)
	},
}).ParseFS(assets, "assets/*.html"))

// cut shortens printable text to limit runes.
func cut(s string, limit int) string {
	n := 0
	for i := range s {
		if n == limit {
			return s[:i] + "…"
		}
		n++
	}
	return s
}

// durText shows a duration of ns nanoseconds the way live.js does.
func durText(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d <= 0:
		return "-"
	case d < time.Microsecond:
		return "<1µs"
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d/time.Microsecond)
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

// ageText shows how old something is (ns nanoseconds), coarser than
// durText: "-", "850ms", "38s", "2m05s", "1h02m". live.js has the same.
func ageText(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return fmt.Sprintf("%dms", d/time.Millisecond)
	case d < time.Minute:
		return fmt.Sprintf("%ds", d/time.Second)
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", d/time.Minute, d%time.Minute/time.Second)
	default:
		return fmt.Sprintf("%dh%02dm", d/time.Hour, d%time.Hour/time.Minute)
	}
}

// clockText is the time of day, UTC.
func clockText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("15:04:05")
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

// page is what every HTML page gets.
type page struct {
	Title, Heading string
	Base           string // the console's Prefix
	Nav            string // "tenants", "dlq" or "log"
	HasEngine      bool
	HasDLQ         bool
	HasFleet       bool
	CanAct         bool // replay and purge are offered: not read-only, and a session
	ReadOnly       bool
	Session        bool
	CSRF           string
	Flash          string
	Warning        string
	Body           any
}

func (c *Console) page(r *http.Request, nav, heading string, body any) *page {
	session := c.hasSession(r)
	p := &page{
		Title: c.o.Title, Heading: heading, Base: c.o.Prefix, Nav: nav,
		HasEngine: c.engine.Load() != nil, HasDLQ: c.dlq.Load() != nil, HasFleet: c.fleet.Load() != nil,
		ReadOnly: c.o.ReadOnly, Session: session, CanAct: session && !c.o.ReadOnly, Body: body,
	}
	if p.CanAct {
		p.CSRF = c.csrfToken()
	}
	return p
}

// html renders template name with p; the page is built in memory first so
// that a template error is a 500, not half a page.
func (c *Console) html(w http.ResponseWriter, status int, name string, p *page) {
	var b bytes.Buffer
	if err := pages.ExecuteTemplate(&b, name, p); err != nil {
		c.o.Logger.Error("console: rendering a page", "page", name, "err", err)
		http.Error(w, "console: rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// wantJSON reports whether the client asked for the JSON API: ?format=json,
// or an Accept header whose first known type is JSON.
func wantJSON(r *http.Request) bool {
	switch r.URL.Query().Get("format") {
	case "json":
		return true
	case "html":
		return false
	}
	for part := range strings.SplitSeq(r.Header.Get("Accept"), ",") {
		mt, _, _ := strings.Cut(part, ";")
		switch strings.TrimSpace(mt) {
		case "application/json", "application/jsonl", "application/x-ndjson":
			return true
		case "text/html":
			return false
		}
	}
	return false
}

// jsonLines starts a JSON Lines answer.
func jsonLines(w http.ResponseWriter, status int) *json.Encoder {
	w.Header().Set("Content-Type", "application/x-ndjson; charset=utf-8")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}

// fail answers an error: an ErrorLine for the JSON API, a page otherwise.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, command string, status int, msg string) {
	if wantJSON(r) {
		jsonLines(w, status).Encode(ErrorLine{Type: "error", Command: command, Error: msg})
		return
	}
	p := c.page(r, "", http.StatusText(status), nil)
	p.Warning = msg
	c.html(w, status, "error", p)
}

// hexDump formats b like hexdump -C: offset, 16 bytes in hex, and the
// printable ASCII ones.
func hexDump(b []byte) string {
	var s strings.Builder
	for off := 0; off < len(b); off += 16 {
		row := b[off:min(off+16, len(b))]
		fmt.Fprintf(&s, "%08x ", off)
		for i := range 16 {
			if i == 8 {
				s.WriteByte(' ')
			}
			if i < len(row) {
				fmt.Fprintf(&s, " %02x", row[i])
			} else {
				s.WriteString("   ")
			}
		}
		s.WriteString("  |")
		for _, ch := range row {
			if ch < 0x20 || ch > 0x7e {
				ch = '.'
			}
			s.WriteByte(ch)
		}
		s.WriteString("|\n")
	}
	return s.String()
}

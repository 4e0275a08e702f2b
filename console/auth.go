package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"
)

// cookieName is the session cookie that GET ?token=TOKEN sets.
const cookieName = "ringfence_console"

// derive returns a value bound to the token for one purpose: the session
// cookie holds derive("session"), so the token itself is never stored in
// the browser, and forms carry derive("csrf").
func (c *Console) derive(purpose string) string {
	m := hmac.New(sha256.New, []byte(c.o.Token))
	m.Write([]byte("ringfence-console/" + purpose))
	return hex.EncodeToString(m.Sum(nil))
}

func (c *Console) csrfToken() string { return c.derive("csrf") }

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// hasSession reports whether the browser holds the session cookie.
func (c *Console) hasSession(r *http.Request) bool {
	ck, err := r.Cookie(cookieName)
	return err == nil && equal(ck.Value, c.derive("session"))
}

// bearer reports whether the request carries Authorization: Bearer TOKEN.
// A browser cannot send that header to another origin without a CORS
// preflight, which the console never grants, so no CSRF token is needed.
func (c *Console) bearer(r *http.Request) bool {
	v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && equal(strings.TrimSpace(v), c.o.Token)
}

// authorized reports whether a POST may change anything: a bearer token,
// or the session cookie together with the form's CSRF token. Cross-origin
// browser requests were refused before (http.CrossOriginProtection).
func (c *Console) authorized(r *http.Request) bool {
	if c.bearer(r) {
		return true
	}
	return c.hasSession(r) && equal(r.PostFormValue("csrf"), c.csrfToken())
}

// login handles GET ...?token=TOKEN: a right token sets the session cookie
// and redirects to the same page without the token in its URL (so it stays
// out of history and logs); a wrong one is refused. It reports whether it
// answered.
func (c *Console) login(w http.ResponseWriter, r *http.Request) bool {
	q := r.URL.Query()
	if !q.Has("token") {
		return false
	}
	if !equal(q.Get("token"), c.o.Token) {
		c.fail(w, r, "login", http.StatusForbidden, "wrong token")
		return true
	}
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: c.derive("session"), Path: c.o.Prefix,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	q.Del("token")
	u := *r.URL
	u.Path = c.o.Prefix + strings.TrimPrefix(r.URL.Path, "/")
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
	return true
}

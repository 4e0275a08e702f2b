package console_test

import (
	"testing"

	"github.com/chromedp/chromedp"
)

// The fleet page in a browser: signed in, a tenant row's Hold button
// writes a hold that every process would apply, shown in the controls;
// Release clears it.
func TestBrowserFleet(t *testing.T) {
	b := newBrowser(t)
	st, base := fleetConsole(t)

	b.do("sign in", chromedp.Navigate(base+"/fleet?token="+testToken))
	b.until("signed in, on the fleet page", `location.search === '' && location.pathname === '/fleet' && !!document.querySelector('#fleet-processes tr[data-process="p1"]')`)
	row := `#fleet-tenants tr[data-token="acme"]`
	b.until("unhealthy tenant listed", `!!document.querySelector('`+row+`') && document.querySelector('`+row+` .state-open') !== null`)

	b.do("hold acme", chromedp.SetValue(chromedp.CSS(row+` input[name="reason"]`), "incident 42"),
		chromedp.Click(chromedp.CSS(row+` button[value="hold"]`)), chromedp.WaitVisible(chromedp.CSS(".flash")))
	b.until("hold shown", `(document.querySelector('.flash') || {}).textContent === 'hold: acme (hold)' && (document.querySelector('#fleet-controls tr[data-token="acme"] .c-control') || {}).textContent === 'hold'`)
	if c := controlOf(t, st, "acme"); !c.Hold || c.Reason != "incident 42" {
		t.Fatalf("control after the Hold button: %+v", c)
	}
	b.shot("fleet")

	ctl := `#fleet-controls tr[data-token="acme"]`
	b.do("release acme", chromedp.SetValue(chromedp.CSS(ctl+` input[name="reason"]`), "fixed"),
		chromedp.Click(chromedp.CSS(ctl+` button[value="release"]`)), chromedp.WaitNotPresent(chromedp.CSS(ctl)))
	b.until("release shown", `(document.querySelector('.flash') || {}).textContent === 'release: acme (none)' && !document.querySelector('`+ctl+`')`)
	if c := controlOf(t, st, "acme"); c.Active() || c.Reason != "fixed" {
		t.Fatalf("control after the Release button: %+v", c)
	}
	if n := b.dialogs.Load(); n != 0 {
		t.Fatalf("%d dialogs opened", n)
	}
}

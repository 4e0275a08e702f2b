// Live updates of the tenant view, from the server-sent events of /live.
// The page is complete without this script; it only keeps it current.
// Everything from the server's JSON is set with textContent (never as
// HTML); the plots section is replaced by the same section of /plots,
// which the server renders with html/template as it renders this page.
(function () {
  'use strict';
  var root = document.getElementById('tenants');
  if (!root || !window.EventSource) { return; }
  var dlqBase = root.dataset.dlq;
  var maxRows = parseInt(root.dataset.maxRows, 10) || 500;
  var status = document.getElementById('live-status');
  var es = new EventSource(root.dataset.live);
  es.onopen = function () { status.textContent = 'live'; };
  es.onerror = function () { status.textContent = 'reconnecting…'; };
  es.addEventListener('stats', function (ev) { render(JSON.parse(ev.data)); });
  es.addEventListener('log', function (ev) { addEvent(JSON.parse(ev.data)); });
  var every = parseInt(root.dataset.every, 10) || 2000;
  setInterval(refreshPlots, every);

  function cut(s, n) {
    var cps = Array.from(s);
    return cps.length > n ? cps.slice(0, n).join('') + '…' : s;
  }
  function tenantName(t) { return t.no_tenant ? '(no tenant)' : cut(t.key, 120); }
  function dur(ns) {
    if (ns <= 0) { return '-'; }
    if (ns < 1e3) { return '<1µs'; }
    if (ns < 1e6) { return Math.floor(ns / 1e3) + 'µs'; }
    if (ns < 1e9) { return (ns / 1e6).toFixed(1) + 'ms'; }
    return (ns / 1e9).toFixed(2) + 's';
  }
  function age(ns) {
    if (ns <= 0) { return '-'; }
    var s = Math.floor(ns / 1e9);
    if (s < 1) { return Math.floor(ns / 1e6) + 'ms'; }
    if (s < 60) { return s + 's'; }
    if (s < 3600) { return Math.floor(s / 60) + 'm' + String(s % 60).padStart(2, '0') + 's'; }
    return Math.floor(s / 3600) + 'h' + String(Math.floor(s / 60) % 60).padStart(2, '0') + 'm';
  }
  function clock(s) { return stamp(s).slice(11); }
  function stamp(s) { return (!s || s.indexOf('0001-') === 0) ? '-' : s.replace('T', ' ').slice(0, 19); }
  function trouble(t) { return t.state !== 'closed' || t.parked > 0 || t.spilling > 0 || t.dlq_unavailable; }
  function cell(tr, cls, text) {
    var td = document.createElement('td');
    if (cls) { td.className = cls; }
    td.textContent = text;
    tr.appendChild(td);
    return td;
  }
  function set(id, text) { var el = document.getElementById(id); if (el) { el.textContent = text; } }

  function render(s) {
    set('snap-time', stamp(s.time));
    ['handled', 'failed', 'dead_lettered', 'retried', 'parked', 'queued', 'in_flight', 'spilling_tenants', 'paused_partitions', 'dlq_unavailable_tenants']
      .forEach(function (k) { set('t-' + k, String(s[k])); });
    set('t-spilled', s.spilled + ' / ' + s.refed);
    set('tenant-count', String(s.tenants.length));

    var ts = s.tenants.slice();
    ts.sort(function (a, b) { return (trouble(b) ? 1 : 0) - (trouble(a) ? 1 : 0); });
    var hidden = Math.max(0, ts.length - maxRows);
    ts = ts.slice(0, maxRows);
    var body = document.createElement('tbody');
    body.id = 'tenant-rows';
    ts.forEach(function (t) {
      var tr = document.createElement('tr');
      tr.dataset.token = t.tenant.token;
      tr.className = (trouble(t) ? 'trouble ' : '') + 'state-' + t.state;
      var td = cell(tr, 'c-tenant', '');
      td.title = t.tenant.key;
      if (dlqBase) {
        var a = document.createElement('a');
        a.href = dlqBase + encodeURIComponent(t.tenant.token);
        a.textContent = tenantName(t.tenant);
        td.appendChild(a);
      } else {
        td.textContent = tenantName(t.tenant);
      }
      cell(tr, 'c-state', t.state);
      cell(tr, 'c-parked', String(t.parked));
      cell(tr, 'c-queued', String(t.queued));
      cell(tr, 'c-in_flight', t.in_flight + ' / ' + t.limit);
      cell(tr, 'c-spilling', String(t.spilling));
      cell(tr, 'c-handled', String(t.handled));
      cell(tr, 'c-failed', String(t.failed));
      cell(tr, 'c-dead_lettered', t.dead_lettered + (t.dlq_unavailable ? ' · dlq-unavailable' : ''));
      cell(tr, 'c-latency', dur(t.latency_ns));
      cell(tr, 'c-commit_lag', String(t.commit_lag));
      var of = cell(tr, 'c-open_for', age(t.open_for_ns));
      if (t.open_since) { of.title = 'since ' + stamp(t.open_since) + ' UTC'; }
      cell(tr, 'c-time_lag', age(t.time_lag_ns));
      cell(tr, 'c-oldest_parked', age(t.oldest_parked_ns));
      cell(tr, 'c-spill_backlog_age', age(t.spill_backlog_age_ns));
      body.appendChild(tr);
    });
    if (!ts.length) { var e = document.createElement('tr'); e.className = 'empty'; cell(e, '', 'no tenants tracked').colSpan = 15; body.appendChild(e); }
    document.getElementById('tenant-rows').replaceWith(body);
    var h = document.getElementById('tenant-hidden');
    h.hidden = hidden === 0;
    h.textContent = hidden + ' more tenants not shown (all are in the JSON).';

    var pb = document.createElement('tbody');
    pb.id = 'partition-rows';
    s.partitions.forEach(function (p) {
      var tr = document.createElement('tr');
      if (p.paused) { tr.className = 'trouble'; }
      cell(tr, '', p.topic + '/' + p.partition);
      cell(tr, '', p.paused ? 'paused: ' + p.pause_reason : 'no');
      cell(tr, '', String(p.queued));
      cell(tr, '', String(p.unsettled));
      cell(tr, '', String(p.commit_lag));
      cell(tr, '', dur(p.oldest_ns));
      cell(tr, '', p.oldest_tenant ? tenantName(p.oldest_tenant) : '-');
      cell(tr, '', String(p.lanes));
      pb.appendChild(tr);
    });
    if (!s.partitions.length) { var pe = document.createElement('tr'); pe.className = 'empty'; cell(pe, '', 'no partitions assigned').colSpan = 8; pb.appendChild(pe); }
    document.getElementById('partition-rows').replaceWith(pb);
  }

  function span(li, cls, text) {
    var el = document.createElement('span');
    el.className = cls;
    el.textContent = text;
    li.appendChild(document.createTextNode(' '));
    li.appendChild(el);
  }
  function addEvent(e) {
    var list = document.getElementById('event-list');
    var empty = list.querySelector('.empty');
    if (empty) { empty.remove(); }
    // A run that grew comes again under a new seq: it replaces its line.
    list.querySelectorAll('li[data-run]').forEach(function (old) {
      if (old.dataset.run === String(e.run)) { old.remove(); }
    });
    var li = document.createElement('li');
    li.dataset.run = String(e.run);
    var tm = document.createElement('time');
    tm.textContent = stamp(e.time);
    li.appendChild(tm);
    span(li, 'kind kind-' + e.kind, (e.kinds || [e.kind]).join('/'));
    if (e.tenant) { span(li, 'who', tenantName(e.tenant)); }
    if (e.count > 1) { span(li, 'run', '×' + e.count + ', ' + clock(e.first) + '–' + clock(e.last)); }
    if (e.topic) { span(li, 'where', e.topic + '/' + e.partition); }
    var extra = (e.reason ? ' reason ' + e.reason : '') + (e.pause ? ' (' + e.pause + ')' : '') + (e.spill ? ' (' + e.spill + ')' : '');
    if (extra) { li.appendChild(document.createTextNode(extra)); }
    if (e.error) { span(li, 'err', e.error); }
    list.insertBefore(li, list.firstChild);
    while (list.children.length > 20) { list.removeChild(list.lastChild); }
  }

  var plotsBusy = false;
  function refreshPlots() {
    if (plotsBusy || document.hidden) { return; }
    plotsBusy = true;
    fetch(root.dataset.plots, { headers: { Accept: 'text/html' }, credentials: 'same-origin' })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, 'text/html').getElementById('plots');
        var cur = document.getElementById('plots');
        if (fresh && cur) { cur.replaceWith(document.importNode(fresh, true)); }
      })
      .catch(function () {})
      .then(function () { plotsBusy = false; });
  }
}());

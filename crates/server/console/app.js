// The Steadfast console: draws sessions from the public API, as any client would.
// Everything shown is put into the page as text (never as markup), so nothing a model,
// a tool or a user wrote can run here.
'use strict';

const ctx = (() => {
  const d = document.body.dataset;
  const page = d.page;
  return {
    page,
    owner: d.owner || '',
    runs: d.runs === 'true',
    session: d.session || '',
    auth: d.auth || 'none',
    // A view link's secret: its page reads with it as the bearer token.
    share: page === 'share' ? decodeURIComponent(location.pathname.split('/').pop()) : null,
  };
})();

// ---------------------------------------------------------------- little helpers

/** An element with attributes (`on*` are listeners) and children (strings become text). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

function usd(n) {
  if (typeof n !== 'number') return '—';
  return n < 0.01 && n > 0 ? '$' + n.toFixed(4) : '$' + n.toFixed(2);
}

function ago(ms) {
  if (!ms) return '—';
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + ' s ago';
  if (s < 3600) return Math.round(s / 60) + ' min ago';
  if (s < 86400) return Math.round(s / 3600) + ' h ago';
  return new Date(ms).toLocaleString();
}

/** A message in the page's live region, read out by screen readers. */
function say(text, bad) {
  const el = document.getElementById('notice');
  if (!el) return;
  el.textContent = text;
  el.className = bad ? 'notice bad' : 'notice';
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || 'HTTP ' + status);
    this.status = status;
    this.code = body && body.code;
  }
}

/** Calls the API: the console's cookie (or a view link's secret) is the credential. */
async function api(method, path, opts = {}) {
  const headers = { Accept: opts.accept || 'application/json' };
  if (ctx.share) headers.Authorization = 'Bearer ' + ctx.share;
  let body;
  if (opts.json !== undefined) {
    headers['Content-Type'] = 'application/json';
    body = JSON.stringify(opts.json);
  }
  const res = await fetch(path, { method, headers, body, credentials: 'same-origin' });
  if (res.status === 401 && !ctx.share && ctx.auth === 'login') {
    location.href = '/ui/login';
  }
  if (!res.ok) {
    let err = null;
    try { err = await res.json(); } catch (_) { /* not JSON */ }
    throw new ApiError(res.status, err);
  }
  return res;
}

const getJson = async (path) => (await api('GET', path)).json();
const sessionPath = (rest) => '/v1/sessions/' + encodeURIComponent(ctx.session) + (rest || '');

// ---------------------------------------------------------------- the top bar

function topBar() {
  const who = document.getElementById('who');
  if (!who) return;
  if (ctx.share) {
    who.append(h('span', { class: 'badge' }, 'shared, read-only'));
    return;
  }
  if (ctx.owner) who.append(h('span', {}, ctx.owner));
  if (ctx.auth === 'login') {
    const form = h('form', { method: 'post', action: '/ui/logout', class: 'inline' },
      h('button', { type: 'submit', class: 'link' }, 'Log out'));
    who.append(' ', form);
  }
}

// ---------------------------------------------------------------- the sessions page

const STATUSES = ['', 'idle', 'running', 'waiting', 'escalated', 'completed', 'failed', 'closed'];
const PAGE_SIZE = 50;

function sessionsPage(main) {
  const state = { cursors: [null], at: 0, details: new Map(), timer: null };
  const status = h('select', { id: 'f-status', name: 'status' },
    STATUSES.map((s) => h('option', { value: s }, s || 'any')));
  const agent = h('input', { id: 'f-agent', name: 'agent', placeholder: 'any agent' });
  const title = h('input', { id: 'f-title', name: 'title', type: 'search', placeholder: 'title contains' });
  const filters = h('form', { class: 'filters', role: 'search', onsubmit: (e) => { e.preventDefault(); state.cursors = [null]; state.at = 0; load(); } },
    h('label', { for: 'f-status' }, 'Status'), status,
    h('label', { for: 'f-agent' }, 'Agent'), agent,
    h('label', { for: 'f-title' }, 'Title'), title,
    h('button', { type: 'submit' }, 'Filter'));
  const tbody = h('tbody', { id: 'sessions' });
  const table = h('table', { class: 'sessions' },
    h('caption', { class: 'visually-hidden' }, 'Your sessions, newest first'),
    h('thead', {}, h('tr', {}, ['Title', 'Status', 'Agent', 'Model', 'Owner', 'Cost', 'Turn', 'Last activity'].map((c) => h('th', { scope: 'col' }, c)))),
    tbody);
  const prev = h('button', { type: 'button', id: 'prev', onclick: () => { if (state.at > 0) { state.at--; load(); } } }, '← Newer');
  const next = h('button', { type: 'button', id: 'next', onclick: () => { if (state.cursors[state.at + 1]) { state.at++; load(); } } }, 'Older →');
  const pageNo = h('span', { id: 'page-no' });
  clear(main).append(h('h1', {}, 'Sessions'), h('p', { id: 'notice', class: 'notice', role: 'status', 'aria-live': 'polite' }),
    filters, table, h('nav', { class: 'pager', 'aria-label': 'pages' }, prev, pageNo, next));

  async function detail(row) {
    // The list row lacks model and cost: read the session when it has moved on.
    const known = state.details.get(row.id);
    if (known && known.last_seq === row.last_seq) return known;
    const d = await getJson('/v1/sessions/' + encodeURIComponent(row.id));
    state.details.set(row.id, d);
    return d;
  }

  async function load() {
    clearTimeout(state.timer);
    const q = new URLSearchParams({ limit: String(PAGE_SIZE) });
    if (status.value) q.set('status', status.value);
    if (agent.value.trim()) q.set('agent', agent.value.trim());
    if (title.value.trim()) q.set('title', title.value.trim());
    const cursor = state.cursors[state.at];
    if (cursor) q.set('cursor', cursor);
    try {
      const list = await getJson('/v1/sessions?' + q);
      state.cursors[state.at + 1] = list.next_cursor || null;
      state.cursors.length = state.at + 2;
      const rows = await Promise.all(list.sessions.map(async (s) => {
        let d = null;
        try { d = await detail(s); } catch (_) { /* gone meanwhile */ }
        return sessionRow(s, d);
      }));
      clear(tbody).append(...rows);
      if (!rows.length) tbody.append(h('tr', {}, h('td', { colspan: 8, class: 'empty' }, 'No sessions match.')));
      prev.disabled = state.at === 0;
      next.disabled = !state.cursors[state.at + 1];
      pageNo.textContent = 'page ' + (state.at + 1);
      say('');
    } catch (e) {
      say('Could not list sessions: ' + e.message, true);
    }
    // Live: the page is read again every few seconds.
    state.timer = setTimeout(load, 3000);
  }
  load();
}

function sessionRow(s, d) {
  return h('tr', { 'data-id': s.id },
    h('td', {}, h('a', { href: '/ui/sessions/' + encodeURIComponent(s.id) }, s.title || s.id)),
    h('td', {}, statusBadge(s.status)),
    h('td', {}, s.agent),
    h('td', {}, d ? d.model : '—'),
    h('td', {}, s.owner),
    h('td', { class: 'num' }, d ? usd(d.cost_usd) : '—'),
    h('td', { class: 'num' }, d ? String(d.turn) : '—'),
    h('td', {}, h('time', { datetime: new Date(s.updated_at_ms).toISOString() }, ago(s.updated_at_ms))));
}

function statusBadge(status) {
  return h('span', { class: 'status status-' + status }, status);
}

// ---------------------------------------------------------------- one session

/** How many events the timeline shows before "earlier events" must be asked for. */
const WINDOW = 300;

function sessionPage(main) {
  const view = {
    summary: null,
    first: 0, // the earliest position shown
    last: 0, // the latest position shown: the stream continues after it
    calls: new Map(), // tool call id -> its block
    models: new Map(), // model call id -> its text element
    intents: new Map(), // tool call id -> its intent event
    refresh: null,
  };
  const summary = h('section', { id: 'summary', 'aria-label': 'summary' });
  const waiting = h('section', { id: 'waiting', 'aria-live': 'polite' });
  const controls = h('section', { id: 'controls', 'aria-label': 'control' });
  const earlier = h('button', { type: 'button', id: 'earlier', hidden: true, onclick: () => loadEarlier() }, 'Show earlier events');
  const timeline = h('ol', { id: 'timeline', class: 'timeline', 'aria-label': 'timeline' });
  const workspace = h('section', { id: 'workspace', 'aria-label': 'workspace' });
  clear(main).append(
    h('p', {}, ctx.share ? '' : h('a', { href: '/ui' }, '← Sessions')),
    h('p', { id: 'notice', class: 'notice', role: 'status', 'aria-live': 'polite' }),
    summary, waiting, controls,
    h('h2', {}, 'Timeline'), earlier, timeline,
    h('h2', {}, 'Workspace'), workspace);

  // -- the summary, read again (at most every half second) as events arrive
  async function readSummary() {
    try {
      const s = await getJson(sessionPath());
      view.summary = s;
      const notice = document.getElementById('notice');
      if (notice && notice.textContent.startsWith('Could not read the session')) say('');
      drawSummary(s);
      drawWaiting(s);
      return s;
    } catch (e) {
      say(e.status === 404 ? 'No such session.' : 'Could not read the session: ' + e.message, true);
      return null;
    }
  }
  function summarySoon() {
    if (view.refresh) return;
    view.refresh = setTimeout(() => { view.refresh = null; readSummary(); }, 500);
  }

  function drawSummary(s) {
    const l = s.limits || {};
    const bound = (v, f) => (v === undefined || v === null ? 'none' : f(v));
    clear(summary).append(
      h('h1', {}, s.title || s.id),
      h('dl', { class: 'facts' },
        fact('Status', statusBadge(s.status), s.retry ? ' (retry ' + s.retry.attempt + ': ' + s.retry.reason + ')' : '',
          s.end_reason ? ' — ' + s.end_reason : ''),
        fact('Agent', s.agent), fact('Model', s.model), fact('Turn', String(s.turn)),
        fact('Spent', usd(s.cost_usd), s.budget_usd != null ? ' of ' + usd(s.budget_usd) : ''),
        fact('Tokens', (s.usage.input_tokens + s.usage.output_tokens).toLocaleString() + ' (in ' + s.usage.input_tokens.toLocaleString() + ', out ' + s.usage.output_tokens.toLocaleString() + ')'),
        fact('Bounds', 'turns ' + bound(l.max_turns, String) + ', tokens ' + bound(l.max_tokens, String) + ', time ' + bound(l.max_duration_ms, (v) => Math.round(v / 1000) + ' s')),
        fact('Network', s.network || 'default'),
        s.parent ? fact('Forked from', h('a', { href: '/ui/sessions/' + encodeURIComponent(s.parent) }, s.parent), ' at ' + s.forked_at) : null,
        fact('Id', h('code', {}, s.id))));
  }

  function fact(name, ...value) {
    return [h('dt', {}, name), h('dd', {}, ...value)];
  }

  // -- a wait: approve or deny, seeing what is asked; an escalation: resume
  function drawWaiting(s) {
    clear(waiting);
    if (s.status !== 'waiting' && s.status !== 'escalated') return;
    const box = h('div', { class: 'wait', role: 'group', 'aria-label': 'waiting' });
    if (s.status === 'escalated') {
      box.append(h('h2', {}, 'Stopped by a bound'),
        h('p', {}, (s.escalated_by ? s.escalated_by + ': ' : '') + (s.waiting_reason || 'a bound was reached')));
      if (!ctx.share && ctx.runs) box.append(resumeForm());
      waiting.append(box);
      return;
    }
    box.append(h('h2', {}, 'Waiting for ' + s.waiting_for), h('p', { class: 'reason' }, s.waiting_reason || ''));
    const call = s.waiting_call;
    if (call) {
      box.append(h('p', {}, 'The call: ', h('code', {}, call.tool)), codeOf(call.tool, call.input));
    }
    if (!ctx.share && ctx.runs) {
      const answer = (approved) => async () => {
        try {
          await api('POST', sessionPath('/signals/' + encodeURIComponent(s.waiting_for) + '?wait=' + s.waiting_since),
            { json: approved === null ? {} : { approved } });
          say(approved === false ? 'Denied.' : 'Sent.');
          readSummary();
        } catch (e) { say('Not sent: ' + e.message, true); }
      };
      if (s.waiting_for === 'approval') {
        box.append(h('div', { class: 'buttons' },
          h('button', { type: 'button', id: 'approve', class: 'go', onclick: answer(true) }, 'Approve'),
          h('button', { type: 'button', id: 'deny', class: 'stop', onclick: answer(false) }, 'Deny')));
      } else {
        box.append(h('div', { class: 'buttons' },
          h('button', { type: 'button', id: 'signal', onclick: answer(null) }, 'Send ' + s.waiting_for)));
      }
    }
    waiting.append(box);
  }

  function resumeForm() {
    const cost = h('input', { id: 'r-cost', type: 'number', min: '0', step: '0.01', placeholder: 'max cost, $' });
    const turns = h('input', { id: 'r-turns', type: 'number', min: '0', step: '1', placeholder: 'max turns' });
    return h('form', { class: 'row', onsubmit: async (e) => {
      e.preventDefault();
      const bounds = {};
      if (cost.value) bounds.max_cost_usd = Number(cost.value);
      if (turns.value) bounds.max_turns = Number(turns.value);
      try {
        await api('POST', sessionPath('/signals/resume'), { json: bounds });
        say('Resumed.');
        readSummary();
      } catch (e2) { say('Not resumed: ' + e2.message, true); }
    } }, h('label', { for: 'r-cost' }, 'New bounds'), cost, turns, h('button', { type: 'submit', id: 'resume' }, 'Resume'));
  }

  // -- control: message, steer, interrupt, close, delete, share, fork, rewind, previews
  function drawControls() {
    if (ctx.share || !ctx.runs) return;
    const text = h('textarea', { id: 'message', rows: 3, placeholder: 'A message opens a turn; a steer reaches the running one.', 'aria-label': 'message' });
    const send = (kind) => async () => {
      if (!text.value.trim()) return;
      try {
        await api('POST', sessionPath('/messages'), { json: { text: text.value, kind } });
        text.value = '';
        say(kind === 'steer' ? 'Steer sent.' : 'Message sent.');
        summarySoon();
      } catch (e) { say('Not sent: ' + e.message, true); }
    };
    const act = (label, id, method, path, opts = {}) => h('button', { type: 'button', id, class: opts.cls, onclick: async () => {
      if (opts.confirm && !window.confirm(opts.confirm)) return;
      try {
        const res = await api(method, sessionPath(path), { json: opts.json });
        say(label + ': done.');
        if (opts.after) opts.after(res);
        summarySoon();
      } catch (e) { say(label + ': ' + e.message, true); }
    } }, label);
    const links = h('div', { id: 'links' });
    clear(controls).append(
      h('div', { class: 'compose' }, text,
        h('div', { class: 'buttons' },
          h('button', { type: 'button', id: 'send', onclick: send('message') }, 'Send'),
          h('button', { type: 'button', id: 'steer', onclick: send('steer') }, 'Steer'),
          act('Interrupt', 'interrupt', 'POST', '/interrupt', { cls: 'stop' }))),
      h('div', { class: 'buttons' },
        act('Share read-only', 'share', 'POST', '/links', { json: { expires_in_s: 86400 }, after: async (res) => {
          const made = await res.json();
          const url = location.origin + made.url;
          clear(links).append(h('p', {}, 'Read-only link (24 h): ', h('a', { id: 'share-url', href: url }, url)));
        } }),
        h('button', { type: 'button', id: 'ports', onclick: () => previews(links) }, 'Previews'),
        h('button', { type: 'button', id: 'open-shell', onclick: () => shell(links) }, 'Shell'),
        act('Close', 'close', 'POST', '/close', { confirm: 'Close this session? It takes no more messages.' }),
        act('Delete', 'delete', 'DELETE', '', { cls: 'stop', confirm: 'Delete this session and its history?', after: () => { location.href = '/ui'; } })),
      links);
  }

  async function previews(into) {
    try {
      const listed = await getJson(sessionPath('/ports'));
      const ports = listed.ports || [];
      clear(into).append(h('p', {}, ports.length ? 'Listening in the sandbox:' : 'Nothing listens in the sandbox.'),
        h('ul', {}, ports.map((p) => h('li', {}, 'port ' + p.port + ' ',
          h('button', { type: 'button', onclick: async () => {
            const res = await api('POST', sessionPath('/links'), { json: { port: p.port } });
            const made = await res.json();
            window.open(made.url, '_blank', 'noopener');
          } }, 'Open a preview')))));
    } catch (e) { say('Previews: ' + e.message, true); }
  }

  /** A shell in the sandbox, line by line: what it prints (terminal escapes removed)
   * and a line to type. Between turns it may write, and what it changes is recorded;
   * while a turn runs it is read-only. */
  function shell(into) {
    const old = document.getElementById('shell');
    if (old) { old.querySelector('input').focus(); return; }
    const screen = h('pre', { class: 'shell-screen', 'aria-live': 'polite' });
    const line = h('input', { id: 'shell-line', 'aria-label': 'shell input', autocomplete: 'off', spellcheck: 'false' });
    const state = h('span', { id: 'shell-state', class: 'meta' }, 'connecting…');
    const proto = location.protocol === 'https:' ? 'wss://' : 'ws://';
    const ws = new WebSocket(proto + location.host + sessionPath('/shell?editing=false&rows=40&cols=120'));
    ws.binaryType = 'arraybuffer';
    const decoder = new TextDecoder();
    const leave = h('button', { type: 'button', id: 'shell-leave', onclick: () => ws.readyState === 1 && ws.send(JSON.stringify({ type: 'detach' })) }, 'Leave');
    const box = h('div', { id: 'shell', class: 'shell' }, h('div', { class: 'row' }, h('strong', {}, 'Shell'), state, leave), screen,
      h('form', { class: 'row', onsubmit: (e) => {
        e.preventDefault();
        if (ws.readyState === 1) ws.send(JSON.stringify({ type: 'input', data: line.value + '\n' }));
        line.value = '';
      } }, h('label', { for: 'shell-line' }, '$'), line));
    into.append(box);
    ws.onmessage = (m) => {
      if (typeof m.data === 'string') {
        const notice = JSON.parse(m.data);
        if (notice.type === 'attached') state.textContent = notice.mode;
        else if (notice.type === 'leave') state.textContent = 'asked to leave: ' + notice.reason;
        else if (notice.type === 'exit') state.textContent = 'ended (exit ' + notice.code + ')' + (notice.changes && notice.changes.length ? ', changed ' + notice.changes.join(', ') : '');
        return;
      }
      // Colours, cursor moves and titles are dropped: this is a transcript, not a terminal.
      const text = decoder.decode(new Uint8Array(m.data), { stream: true })
        .replace(/\x1b\][^\x07\x1b]*(\x07|\x1b\\)/g, '')
        .replace(/\x1b\[[0-9;?]*[ -\/]*[@-~]/g, '')
        .replace(/\x1b[@-_]/g, '')
        .replace(/\r/g, '');
      screen.append(document.createTextNode(text));
      screen.scrollTop = screen.scrollHeight;
    };
    ws.onclose = () => {
      if (!/^ended/.test(state.textContent)) state.textContent = 'closed';
      line.disabled = true;
      leave.disabled = true;
      box.id = 'shell-closed';
    };
    line.focus();
  }

  // -- the timeline
  function blockFor(ev) {
    const li = h('li', { class: 'ev ev-' + ev.type, 'data-seq': ev.seq, 'data-type': ev.type });
    const head = h('div', { class: 'ev-head' }, h('span', { class: 'seq' }, '#' + ev.seq), ' ',
      h('span', { class: 'kind' }, ev.type.replace(/_/g, ' ')), ' ',
      h('time', { datetime: new Date(ev.at_ms).toISOString() }, new Date(ev.at_ms).toLocaleTimeString()));
    li.append(head);
    return li;
  }

  /** Adds one event to the timeline, at its end or (`before`) ahead of the rest. */
  function draw(ev, before) {
    const put = (el) => (before ? timeline.insertBefore(el, before) : timeline.append(el));
    switch (ev.type) {
      case 'model_delta': {
        let text = view.models.get(ev.call_id);
        if (!text) {
          const li = blockFor(ev);
          li.classList.add('ev-model');
          li.querySelector('.kind').textContent = 'model reply';
          text = h('div', { class: 'model-text', 'data-call': ev.call_id });
          li.append(text);
          view.models.set(ev.call_id, text);
          put(li);
        }
        if (before) {
          // Earlier events, drawn ahead of the rest: their text comes first.
          text.prepend(document.createTextNode(ev.text));
          return;
        }
        if (ev.restart) text.textContent = '';
        text.append(document.createTextNode(ev.text));
        return;
      }
      case 'exchange_outcome': {
        // A wrapped CLI's request: its streamed text is under the exchange's id.
        const text = view.models.get(ev.call_id);
        if (text) {
          text.closest('li').append(h('div', { class: 'meta', 'data-seq': ev.seq }, 'HTTP ' + ev.status + ' · ' + usd(ev.cost_usd)));
          return;
        }
        const li = blockFor(ev);
        li.append(h('div', { class: 'meta' }, 'HTTP ' + ev.status + ' · ' + usd(ev.cost_usd)));
        put(li);
        return;
      }
      case 'model_call_outcome': {
        const text = view.models.get(ev.call_id);
        if (text) {
          // The streamed text is the reply; the outcome adds what it cost.
          text.closest('li').append(h('div', { class: 'meta', 'data-seq': ev.seq }, ev.stop_reason + ' · ' + usd(ev.cost_usd)));
          return;
        }
        const li = blockFor(ev);
        if (ev.text) li.append(h('div', { class: 'model-text' }, ev.text));
        li.append(h('div', { class: 'meta' }, ev.stop_reason + ' · ' + usd(ev.cost_usd)));
        put(li);
        return;
      }
      case 'tool_call_intent': {
        const li = blockFor(ev);
        view.intents.set(ev.call_id, ev);
        li.append(h('div', { class: 'tool' }, h('code', { class: 'tool-name' }, ev.tool), ' ', h('span', { class: 'class' }, ev.class)),
          codeOf(ev.tool, ev.input));
        view.calls.set(ev.call_id, li);
        put(li);
        return;
      }
      case 'tool_call_outcome': {
        const li = blockFor(ev);
        li.append(outcomeOf(ev));
        put(li);
        return;
      }
      default: {
        const li = blockFor(ev);
        const line = describe(ev);
        if (line) li.append(h('div', { class: 'what' }, line));
        const rest = Object.assign({}, ev);
        delete rest.type; delete rest.seq; delete rest.at_ms;
        if (Object.keys(rest).length) {
          li.append(h('details', {}, h('summary', {}, 'details'), h('pre', {}, JSON.stringify(rest, null, 2))));
        }
        put(li);
      }
    }
  }

  function outcomeOf(ev) {
    const box = h('div', { class: 'outcome' + (ev.is_error ? ' error' : '') });
    const intent = view.intents.get(ev.call_id);
    box.append(h('div', { class: 'meta' },
      (intent ? intent.tool + ' ' : '') + (ev.exit_code !== null && ev.exit_code !== undefined ? 'exit ' + ev.exit_code : (ev.is_error ? 'error' : 'done')),
      ' · ' + ev.output.bytes.toLocaleString() + ' bytes'));
    const pre = h('pre', { class: 'output', hidden: ev.output.bytes === 0 }, ev.output.excerpt);
    if (ev.output.excerpt_end) pre.append('\n…\n' + ev.output.excerpt_end);
    box.append(pre);
    const buttons = h('div', { class: 'buttons' });
    if (ev.output.truncated) {
      buttons.append(h('button', { type: 'button', class: 'whole', onclick: async (e) => {
        try {
          const res = await api('GET', sessionPath('/outputs/' + ev.seq), { accept: 'text/plain' });
          pre.textContent = await res.text();
          e.target.remove();
        } catch (err) { say('Output: ' + err.message, true); }
      } }, 'Show all ' + ev.output.bytes.toLocaleString() + ' bytes'));
    }
    if (intent && intent.class !== 'read') {
      buttons.append(h('button', { type: 'button', class: 'step-diff', onclick: () => showDiff(intent.seq, ev.seq) }, 'Diff of this step'));
    }
    box.append(buttons);
    return box;
  }

  async function loadEarlier() {
    const to = view.first - 1;
    const from = Math.max(0, to - WINDOW);
    if (to < 1) return;
    const firstShown = timeline.firstChild;
    const events = await pages(from, to);
    for (const ev of events) draw(ev, firstShown);
    view.first = from + 1;
    earlier.hidden = view.first <= 1;
  }

  /** Every event after `after`, up to `upto` (or the end), page by page. */
  async function pages(after, upto) {
    const out = [];
    for (;;) {
      const page = await getJson(sessionPath('/events?after=' + after + '&limit=1000'));
      for (const ev of page.events) {
        if (upto && ev.seq > upto) return out;
        out.push(ev);
      }
      if (!page.has_more || !page.events.length) return out;
      after = page.next_after;
    }
  }

  function accept(ev) {
    // Exactly once: a reconnect continues after the last position shown.
    if (ev.seq <= view.last) return;
    view.last = ev.seq;
    timeline.dataset.last = String(ev.seq);
    draw(ev);
    summarySoon();
  }

  /** The live tail: server-sent events read with `fetch` (so a view link can send its
   * secret as a header), open until the session ends, reconnecting after the last
   * position shown whenever the connection drops. */
  async function follow() {
    let backoff = 500;
    for (;;) {
      try {
        const headers = { Accept: 'text/event-stream', 'Last-Event-ID': String(view.last) };
        if (ctx.share) headers.Authorization = 'Bearer ' + ctx.share;
        const res = await fetch(sessionPath('/events?until=ended'), { headers, credentials: 'same-origin' });
        if (res.status === 401 || res.status === 404) {
          say(res.status === 404 ? 'This session is gone.' : 'Your login has ended.', true);
          if (res.status === 401 && !ctx.share && ctx.auth === 'login') location.href = '/ui/login';
          return;
        }
        if (!res.ok || !res.body) throw new Error('HTTP ' + res.status);
        timeline.dataset.connected = 'true';
        timeline.dataset.connects = String(Number(timeline.dataset.connects || 0) + 1);
        backoff = 500;
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = '';
        let frame = { event: 'message', data: [] };
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let nl;
          while ((nl = buffer.indexOf('\n')) >= 0) {
            let line = buffer.slice(0, nl);
            buffer = buffer.slice(nl + 1);
            if (line.endsWith('\r')) line = line.slice(0, -1);
            if (line === '') {
              if (frame.event === 'message' && frame.data.length) accept(JSON.parse(frame.data.join('\n')));
              if (frame.event === 'end') {
                // The session has ended: nothing more will come.
                timeline.dataset.connected = 'ended';
                summarySoon();
                return;
              }
              frame = { event: 'message', data: [] };
            } else if (line.startsWith('data:')) {
              frame.data.push(line.slice(5).replace(/^ /, ''));
            } else if (line.startsWith('event:')) {
              frame.event = line.slice(6).trim();
            }
          }
        }
      } catch (_) {
        // The server went away (a restart, a network blip): try again.
        backoff = Math.min(backoff * 2, 4000);
      }
      timeline.dataset.connected = 'false';
      await new Promise((r) => setTimeout(r, backoff));
    }
  }

  // -- the workspace: the diff of any step or range, files at any step, the archive
  const diffOut = h('div', { id: 'diff' });
  async function showDiff(from, to) {
    try {
      const q = new URLSearchParams();
      if (from !== '' && from !== undefined) q.set('from', String(from));
      if (to !== '' && to !== undefined) q.set('to', String(to));
      const d = await getJson(sessionPath('/diff?' + q));
      clear(diffOut).append(h('h3', {}, 'Changes from #' + d.from_seq + ' to #' + d.to_seq),
        d.files.length ? '' : h('p', {}, 'Nothing changed.'),
        ...d.files.map((f) => h('div', { class: 'file-diff' },
          h('h4', {}, f.path + ' (' + f.change + ')'),
          f.patch ? patchOf(f.patch) : h('p', { class: 'note' }, f.note || ''))));
      diffOut.scrollIntoView({ block: 'nearest' });
    } catch (e) { say('Diff: ' + e.message, true); }
  }

  function drawWorkspace() {
    const from = h('input', { id: 'w-from', type: 'number', min: '0', placeholder: 'from #' });
    const to = h('input', { id: 'w-to', type: 'number', min: '0', placeholder: 'to # (now)' });
    const at = h('input', { id: 'w-at', type: 'number', min: '0', placeholder: 'at # (now)' });
    const files = h('div', { id: 'files' });
    const archive = h('a', { id: 'archive', href: '#', download: 'workspace.tar' }, 'Download the archive');
    archive.addEventListener('click', async (e) => {
      // Fetched (not followed) so a view link's secret goes as a header, not in a URL.
      e.preventDefault();
      try {
        const res = await api('GET', sessionPath('/archive' + (at.value ? '?at=' + at.value : '')), { accept: 'application/x-tar' });
        const url = URL.createObjectURL(await res.blob());
        const a = h('a', { href: url, download: ctx.session + (at.value ? '-at-' + at.value : '') + '.tar' });
        document.body.append(a); a.click(); a.remove();
        setTimeout(() => URL.revokeObjectURL(url), 10000);
      } catch (err) { say('Archive: ' + err.message, true); }
    });
    const listFiles = async () => {
      try {
        const l = await getJson(sessionPath('/files' + (at.value ? '?at=' + at.value : '')));
        clear(files).append(h('h3', {}, 'Files at #' + l.at_seq),
          h('ul', { class: 'files' }, l.entries.map((e) => h('li', {},
            e.entry.kind === 'file'
              ? h('button', { type: 'button', class: 'link', onclick: () => showFile(e.path, l.at_seq, files) }, e.path)
              : h('span', {}, e.path + (e.entry.kind === 'dir' ? '/' : ' (' + e.entry.kind + ')')),
            e.entry.size !== undefined ? h('span', { class: 'size' }, ' ' + e.entry.size.toLocaleString() + ' B') : ''))));
      } catch (err) { say('Files: ' + err.message, true); }
    };
    const forkRewind = [];
    if (!ctx.share && ctx.runs) {
      forkRewind.push(
        h('button', { type: 'button', id: 'fork', onclick: async () => {
          try {
            const res = await api('POST', sessionPath('/fork'), { json: at.value ? { at: Number(at.value) } : {} });
            const made = await res.json();
            location.href = '/ui/sessions/' + encodeURIComponent(made.sessions[0].id);
          } catch (err) { say('Fork: ' + err.message, true); }
        } }, 'Fork here'),
        h('button', { type: 'button', id: 'rewind', class: 'stop', onclick: async () => {
          if (!at.value) { say('Rewind: say to which position (#).', true); return; }
          if (!window.confirm('Rewind this session to #' + at.value + '? Later events are dropped.')) return;
          try {
            await api('POST', sessionPath('/rewind'), { json: { to: Number(at.value) } });
            location.reload();
          } catch (err) { say('Rewind: ' + err.message, true); }
        } }, 'Rewind here'));
    }
    clear(workspace).append(
      h('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); showDiff(from.value, to.value); } },
        h('label', { for: 'w-from' }, 'Diff'), from, to, h('button', { type: 'submit', id: 'diff-range' }, 'Show the diff')),
      h('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); listFiles(); } },
        h('label', { for: 'w-at' }, 'Files'), at, h('button', { type: 'submit', id: 'list-files' }, 'List the files'), archive, ...forkRewind),
      diffOut, files);
  }

  async function showFile(path, atSeq, into) {
    try {
      const res = await api('GET', sessionPath('/files/' + path.split('/').map(encodeURIComponent).join('/') + '?at=' + atSeq), { accept: 'application/octet-stream' });
      const bytes = new Uint8Array(await res.arrayBuffer());
      let text;
      try { text = new TextDecoder('utf-8', { fatal: true }).decode(bytes); } catch (_) { text = null; }
      const old = document.getElementById('file-view');
      if (old) old.remove();
      into.append(h('div', { id: 'file-view' }, h('h3', {}, path + ' at #' + atSeq),
        text === null ? h('p', {}, 'Binary, ' + bytes.length + ' bytes.') : h('pre', { class: 'file' }, text)));
    } catch (e) { say('File: ' + e.message, true); }
  }

  (async () => {
    const s = await readSummary();
    if (!s) return;
    drawControls();
    drawWorkspace();
    // The newest events first: a long session shows its last WINDOW, earlier on demand.
    const after = Math.max(0, s.last_seq - WINDOW);
    const events = await pages(after);
    view.first = after + 1;
    for (const ev of events) accept(ev);
    if (!events.length) view.last = after;
    earlier.hidden = view.first <= 1;
    follow();
  })();
}

/** A tool's input: a command or a patch as code, anything else as JSON. */
function codeOf(tool, input) {
  if (input && typeof input.command === 'string') return h('pre', { class: 'input' }, '$ ' + input.command);
  return h('pre', { class: 'input' }, JSON.stringify(input, null, 2));
}

function patchOf(patch) {
  const pre = h('pre', { class: 'patch' });
  for (const line of patch.split('\n')) {
    const cls = line.startsWith('+') ? 'add' : line.startsWith('-') ? 'del' : line.startsWith('@@') ? 'hunk' : '';
    pre.append(h('span', { class: cls }, line + '\n'));
  }
  return pre;
}

/** One line saying what an event means, for the kinds without their own drawing. */
function describe(ev) {
  switch (ev.type) {
    case 'user_message': return ev.text;
    case 'steered': return 'Steer: ' + ev.text;
    case 'wait_started': return 'Waits for ' + ev.signal + ': ' + ev.reason;
    case 'signal_received': return 'Got ' + ev.signal + ' ' + JSON.stringify(ev.payload);
    case 'turn_ended': return 'Turn ' + ev.turn + ' ended' + (ev.reply ? ': ' + ev.reply : '');
    case 'turn_interrupted': return 'Turn ' + ev.turn + ' interrupted by ' + ev.by + (ev.stopped ? '' : ' (it goes on)');
    case 'tool_call_interrupted': return 'Interrupted call ' + ev.call_id + ': ' + ev.resolution.kind.replace(/_/g, ' ');
    case 'escalated': return 'Stopped by ' + ev.breaker + ': ' + ev.reason;
    case 'drive_failed': return 'Failed (attempt ' + ev.attempt + '): ' + ev.reason;
    case 'restart': return 'Restarted after a crash';
    case 'sandbox_lost': return 'Sandbox lost: ' + ev.reason;
    case 'compacted': return 'History compacted';
    case 'session_ended': return 'Session ended: ' + (ev.state || '') + (ev.reason ? ' — ' + ev.reason : '');
    case 'model_call_failed': return 'Model call failed: ' + ev.message;
    case 'egress': return (ev.denied ? 'Denied ' : 'Reached ') + ev.destination;
    case 'human_shell': return 'A person (' + ev.by + ') in a shell' + (ev.changes && ev.changes.length ? ': changed ' + ev.changes.join(', ') : '');
    case 'error': return ev.message || 'error';
    default: return '';
  }
}

// ---------------------------------------------------------------- start

topBar();
const main = document.getElementById('main');
if (ctx.page === 'sessions') sessionsPage(main);
else if (ctx.page === 'session' || ctx.page === 'share') sessionPage(main);

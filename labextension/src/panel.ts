// The relay side panel: what the broker is waiting for (approvals), what each notebook may do
// (grants, with revoke), what it has spent (budgets), its latest runs (with cancel) and what was decided
// (the audit tail, with the notebook and the time of each decision).
// Plain DOM on a Lumino widget: the panel is small and this keeps the bundle free of React.
import type { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';
import {
  auditParams, budgetMeters, IMeter, lineageLine, notebookOf, offeredChoices, parseFilter, profileBudgets,
  recordMatches, runsParams, scopePrefix, sessionLabel, sessionsOf, teamBudgets, timeOf, usageLine, visible
} from './model';
import { IRelayEvent, RelayClient, RelayError } from './rpc';
import { McpSignInSection } from './mcpSignin';

export {
  auditMatches, auditParams, budgetMeters, lineageLine, notebookOf, offeredChoices, offeredScopes, parseFilter,
  profileBudgets, recordMatches, runMatches, runsParams, scopePrefix, sessionLabel, sessionsOf, teamBudgets, timeOf, usageLine, visible
} from './model';

interface IPending {
  request_id: string;
  origin?: string;
  tool: string;
  server?: string | null;
  tool_class: string;
  arguments: any;
  reasons?: string[];
  deadline?: number;
  tool_changed?: { diff?: string } | null;
  scopes?: string[] | null;
}



function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: { [key: string]: string } = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    node.setAttribute(key, value);
  }
  for (const child of children) {
    // text nodes only: nothing the broker or a model sends is ever parsed as HTML
    node.append(typeof child === 'string' ? document.createTextNode(visible(child)) : child);
  }
  return node;
}

// a meter per day limit: <progress> with numbers only (no string of the broker's becomes markup); the label
// (a team's name in it) is a text node
function meterRow(meter: IMeter): HTMLElement {
  const bar = el('progress', {
    class: meter.over ? 'jp-relay-meter jp-relay-meter-over' : 'jp-relay-meter',
    max: String(meter.limit),
    value: String(Math.min(meter.used, meter.limit)),
    title: visible(`${meter.label}: ${meter.used.toLocaleString('en-US')} of ${meter.limit.toLocaleString('en-US')}`)
  });
  return el('div', { class: 'jp-relay-meter-row' }, el('span', {}, meter.label), bar);
}

function codeOf(args: any): string | null {
  return args && typeof args === 'object' && typeof args.code === 'string' ? args.code : null;
}

function argumentsBesideCode(args: any): any {
  if (codeOf(args) === null) {
    return args;
  }
  const { code: _code, ...rest } = args;
  return rest;
}


// the audit tail the panel reads, and how many of its newest (matching) records it shows
const AUDIT_TAIL = 200;
const AUDIT_SHOWN = 20;
// the runs the panel shows, and how many of the newest it reads for the status bar's running count
const RUNS_SHOWN = 10;
const RUNS_COUNTED = 100;
// a filter typed into a box asks the broker once typing pauses
const FILTER_DEBOUNCE_MS = 300;
// the model requests the sessions section groups (telemetry.query's newest rows), how many sessions it shows, and
// how often it looks again while the panel is shown (a request through relay/anthropic sends no event)
const TELEMETRY_ROWS = 1000;
const SESSIONS_SHOWN = 10;
const SESSIONS_POLL_MS = 10_000;

// events after which the runs, the budgets or the audit tail change (a tool decision is a new audit record)
const REFRESH_ON = new Set([
  'grant.changed', 'run.started', 'run.tool_decided', 'run.done', 'run.error', 'run.cancelled',
  'run.budget_exhausted', 'run.interrupted'
]);

// what the status-bar item shows: requests waiting for a person, runs running, estimated spend today
export interface IRelaySummary {
  pending: number;
  running: number;
  costToday: number;
}

export class RelayPanel extends Widget {
  onSummary: ((summary: IRelaySummary) => void) | null = null;
  private running = 0;
  private costToday = 0;
  private client = new RelayClient();
  private pending = new Map<string, IPending>();
  private inFlight: { added: Map<string, IPending>; resolved: Set<string> } | null = null;
  private abort = new AbortController();
  private status = el('div', { class: 'jp-relay-status' });
  private approvals = el('div', { class: 'jp-relay-approvals' });
  private grants = el('div', { class: 'jp-relay-grants' });
  private audit = el('div', { class: 'jp-relay-audit' });
  private runs = el('div', { class: 'jp-relay-runs' });
  private sessions = el('div', { class: 'jp-relay-sessions' });
  private sessionsTimer: number | null = null;
  // "Sign in to <server>" for HTTP MCP servers with OAuth (mcpSignin.ts, F's; hidden when there are none)
  private signIns = new McpSignInSection(this.client);
  private grantsGeneration = 0;
  // a hub user's `user:<name>/` (from the origins shown), put before a filter's notebook path: the broker lists
  // a hub panel's own origins only (scopePrefix)
  private scope = '';
  private runsFilter = el('input', {
    class: 'jp-relay-runs-filter jp-mod-styled',
    type: 'search',
    placeholder: 'filter: notebook:folder/ or words',
    'aria-label': 'Filter the runs'
  });
  private latestRuns: any[] = [];
  private lastAudit: { records: any[]; error: string | null } = { records: [], error: null };
  private lastRuns: { runs: any[]; error: string | null } | null = null;
  private auditGeneration = 0;
  private runsGeneration = 0;
  private filterTimers: { [list: string]: number } = {};

  constructor() {
    super();
    this.id = 'relay-jupyter-panel';
    this.title.caption = 'Relay: approvals, grants, budgets, audit';
    this.addClass('jp-relay-panel');
    const refresh = el('button', { class: 'jp-relay-refresh jp-mod-styled' }, 'Refresh');
    refresh.onclick = () => void this.refresh();
    // the kill switch: every run of every notebook stops and every pending request is denied (the broker's
    // `kill {all: true}`, a browser-only call)
    const kill = el('button', { class: 'jp-relay-kill jp-mod-styled jp-mod-warn' }, 'Stop all runs');
    const killed = el('div', { class: 'jp-relay-kill-result' });
    kill.onclick = async () => {
      try {
        const r = await this.client.call('kill', { all: true });
        killed.textContent = `Stopped ${r.cancelled_runs} run(s), denied ${r.denied_requests} request(s).`;
      } catch (err) {
        killed.textContent = `Stop failed: ${err instanceof RelayError ? err.message : String(err)}`;
      }
      await this.refresh();
    };
    this.node.append(
      el('h2', {}, 'Relay'),
      this.status,
      kill,
      killed,
      this.signIns.node,
      el('h3', {}, 'Waiting for you'),
      this.approvals,
      el('h3', {}, 'Grants and budgets'),
      this.grants,
      el('h3', {}, 'Runs'),
      this.runsFilter,
      this.runs,
      el('h3', {}, 'Model sessions'),
      this.sessions,
      el('h3', {}, 'Recent decisions'),
      this.auditFilter,
      this.audit,
      refresh
    );
    // the filter's terms for the broker (tool:, decision:, notebook:, origin:) are asked of it, so a match older
    // than the newest rows is found; its plain words narrow what it sent (model.ts parseFilter)
    // (what was sent is narrowed at once, the broker is asked again when typing pauses)
    this.auditFilter.oninput = () => {
      this.renderAudit(this.lastAudit);
      this.filterChanged('audit', () => this.reloadAudit());
    };
    this.runsFilter.oninput = () => {
      this.renderRuns(this.lastRuns);
      this.filterChanged('runs', () => this.reloadRuns());
    };
    void this.start();
  }

  dispose(): void {
    this.abort.abort();
    this.signIns.dispose();
    if (this.sessionsTimer !== null) {
      window.clearInterval(this.sessionsTimer);
    }
    super.dispose();
  }

  // opened (or shown again): the sections that change without an event are read at once, not at the next poll
  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this.refreshSessions();
    void this.signIns.refresh();
  }

  private async start(): Promise<void> {
    // live from now: the state comes from refresh()'s snapshots (replaying the whole log from id 0 on
    // every page load blocked the broker and refreshed once per replayed run.done)
    void this.client.follow(null, event => this.onEvent(event), this.abort.signal);
    // the sessions of the model endpoints change without an event: looked at again while the panel is shown
    this.sessionsTimer = window.setInterval(() => {
      if (this.isVisible) {
        void this.refreshSessions();
      }
    }, SESSIONS_POLL_MS);
    await this.refresh();
  }

  private onEvent(event: IRelayEvent): void {
    if (event.type === 'permission.request') {
      this.pending.set(event.data.request_id, { origin: event.origin ?? undefined, ...event.data } as IPending);
      this.inFlight?.added.set(event.data.request_id, this.pending.get(event.data.request_id) as IPending);
      this.renderApprovals();
    } else if (event.type === 'permission.resolved' || event.type === 'permission_timeout') {
      this.pending.delete(event.data.request_id);
      this.inFlight?.resolved.add(event.data.request_id);
      this.renderApprovals();
    } else if (event.type === 'mcp.sign_in_changed') {
      // a sign-in started or ended (from a cell's relay.sign_in too): the section reads mcp.sign_ins again (the
      // event carries only {server, state}; the link comes from that authenticated call)
      void this.signIns.refresh();
    } else if (REFRESH_ON.has(event.type)) {
      this.scheduleRefresh();
    }
  }

  // one snapshot for a burst of events (a run's decisions come in quick succession)
  private refreshTimer: number | null = null;

  private scheduleRefresh(): void {
    if (this.refreshTimer !== null) {
      return;
    }
    this.refreshTimer = window.setTimeout(() => {
      this.refreshTimer = null;
      void this.refresh();
    }, 300);
  }

  async refresh(): Promise<void> {
    // events that arrive while the snapshot is in flight win over it: a request made just after the
    // snapshot was taken (the first card after Connect) is kept, one resolved meanwhile stays gone
    const flight = { added: new Map<string, IPending>(), resolved: new Set<string>() };
    this.inFlight = flight;
    try {
      const auditGeneration = ++this.auditGeneration;
      const runsGeneration = ++this.runsGeneration;
      const [pending, grants, audit, runs, trust, filteredRuns] = await Promise.all([
        this.client.call('permission.pending'),
        this.client.call('grants.list'),
        this.queryAudit(),
        this.client.call('runs.list', { limit: RUNS_COUNTED }),
        this.client.call('trust.list'),
        this.queryRuns(),
        this.refreshSessions(),
        this.signIns.refresh()
      ]);
      if (this.inFlight !== flight) {
        return; // a newer refresh started meanwhile: its snapshot is the fresher one
      }
      this.pending.clear();
      for (const request of pending.requests ?? []) {
        if (!flight.resolved.has(request.request_id)) {
          this.pending.set(request.request_id, request);
        }
      }
      for (const [id, request] of flight.added) {
        if (!flight.resolved.has(id)) {
          this.pending.set(id, request);
        }
      }
      this.renderApprovals();
      const scope = scopePrefix([...(grants.grants ?? []), ...(runs.runs ?? [])].map((row: any) => row?.origin));
      const rescoped = scope !== this.scope;
      this.scope = scope;
      await this.renderGrants(grants.grants ?? [], trust.trust ?? []);
      this.latestRuns = runs.runs ?? [];
      this.running = this.latestRuns.filter(run => run.state === 'running').length;
      if (auditGeneration === this.auditGeneration) {
        this.renderAudit(audit);
      }
      if (runsGeneration === this.runsGeneration) {
        this.renderRuns(filteredRuns);
      }
      if (rescoped && (this.auditFilter.value.trim() || this.runsFilter.value.trim())) {
        void this.reloadAudit(); // asked before the hub user's scope was known
        void this.reloadRuns();
      }
      this.status.textContent = 'Connected to the relay broker.';
      this.status.classList.remove('jp-relay-error');
    } catch (err) {
      const message = err instanceof RelayError ? err.message : String(err);
      this.status.textContent = `Relay broker unavailable: ${message}`;
      this.status.classList.add('jp-relay-error');
    } finally {
      if (this.inFlight === flight) {
        this.inFlight = null;
      }
    }
  }

  private emitSummary(): void {
    this.onSummary?.({ pending: this.pending.size, running: this.running, costToday: this.costToday });
  }

  private renderApprovals(): void {
    this.emitSummary();
    this.approvals.replaceChildren();
    if (this.pending.size === 0) {
      this.approvals.append(el('p', { class: 'jp-relay-empty' }, 'Nothing is waiting for approval.'));
      return;
    }
    for (const request of this.pending.values()) {
      const card = el(
        'div',
        { class: 'jp-relay-card', 'data-request-id': request.request_id },
        el('div', { class: 'jp-relay-card-title' }, `${request.tool} (${request.tool_class})`),
        el('div', {}, request.origin ?? ''),
        el('pre', { class: 'jp-relay-args' }, JSON.stringify(argumentsBesideCode(request.arguments), null, 2))
      );
      const code = codeOf(request.arguments);
      if (code !== null) {
        // the exact code the call would run (run_code), as text, not as escaped JSON
        card.append(el('div', {}, `code it would run (${code.length} characters):`));
        card.append(el('pre', { class: 'jp-relay-code' }, code));
      }
      for (const reason of request.reasons ?? []) {
        card.append(el('div', { class: 'jp-relay-reason' }, reason));
      }
      if (request.tool_changed) {
        // the tool's description, schema or annotations changed since the run was offered it
        card.append(
          el('div', { class: 'jp-relay-reason' }, '⚠ this tool changed since the run was offered it: ' +
            'its pin and any earlier approval no longer apply')
        );
        if (typeof request.tool_changed.diff === 'string' && request.tool_changed.diff) {
          card.append(el('pre', { class: 'jp-relay-args' }, request.tool_changed.diff));
        }
      }
      const buttons: HTMLButtonElement[] = [];
      const answer = async (decision: string, scope: string) => {
        buttons.forEach(b => (b.disabled = true));
        try {
          await this.client.call('permission.answer', { request_id: request.request_id, decision, scope });
          this.pending.delete(request.request_id);
          this.renderApprovals();
        } catch (err) {
          buttons.forEach(b => (b.disabled = false));
          card.append(el('div', { class: 'jp-relay-error' }, String((err as Error).message)));
        }
      };
      for (const [label, decision, scope] of offeredChoices(request.scopes)) {
        const style = decision === 'deny' ? 'jp-mod-reject' : scope === 'once' ? 'jp-mod-accept' : 'jp-mod-warn';
        const button = el('button', { class: `jp-mod-styled ${style}`, 'data-scope': scope }, label);
        button.onclick = () => void answer(decision, scope);
        buttons.push(button);
      }
      card.append(el('div', { class: 'jp-relay-buttons' }, ...buttons));
      this.approvals.append(card);
    }
  }

  // the sessions section's own snapshot (also on a timer: see start())
  async refreshSessions(): Promise<void> {
    try {
      const got = await this.client.call('telemetry.query', { limit: TELEMETRY_ROWS });
      this.renderSessions(got.rows ?? []);
    } catch (err) {
      this.sessions.replaceChildren(el('p', { class: 'jp-relay-error' },
        `Sessions unavailable: ${err instanceof RelayError ? err.message : String(err)}`));
    }
  }

  private renderSessions(rows: any[]): void {
    // requests per session (issue 16 item 4): count, tokens, cost and lineage of each (origin, session)
    this.sessions.replaceChildren();
    const sessions = sessionsOf(rows);
    if (sessions.length === 0) {
      this.sessions.append(el('p', { class: 'jp-relay-empty' }, 'No model requests yet.'));
      return;
    }
    // one small card per session (a seven-column table did not fit the side panel's width)
    for (const s of sessions.slice(0, SESSIONS_SHOWN)) {
      const figures = el('div', {},
        el('span', { class: 'jp-relay-session-requests' }, String(s.requests)), ' requests · ',
        el('span', { class: 'jp-relay-session-tokens' }, s.tokens.toLocaleString('en-US')), ' tokens · ',
        el('span', { class: 'jp-relay-session-cost' }, `$${s.cost.toFixed(4)}`), ' · last ',
        el('span', { class: 'jp-relay-time' }, timeOf(s.last)));
      if (s.errors) {
        figures.append(' · ', el('span', { class: 'jp-relay-error jp-relay-session-errors' }, `${s.errors} failed`));
      }
      const lineage = lineageLine(s.lineage);
      this.sessions.append(
        el(
          'div',
          { class: 'jp-relay-item jp-relay-session', title: visible(`${s.source}: ${s.models.join(', ')}`) },
          el('div', { class: 'jp-relay-card-title jp-relay-clip' },
            el('span', { class: 'jp-relay-notebook', title: visible(s.origin) }, notebookOf(s.origin)), ' · ',
            el('span', { class: 'jp-relay-session-id', title: visible(s.session) }, sessionLabel(s.session))),
          figures,
          el('div', {}, 'lineage: ', el('span', { class: 'jp-relay-session-lineage' }, lineage || '(not classified)'))
        )
      );
    }
    if (sessions.length > SESSIONS_SHOWN) {
      this.sessions.append(el('p', { class: 'jp-relay-empty' },
        `${sessions.length - SESSIONS_SHOWN} older session(s) not shown (relay.telemetry() in a notebook has them all).`));
    }
  }

  private async renderGrants(grants: any[], trust: any[] = []): Promise<void> {
    // the cards are built first and put in at once: the budget reads take a while, and two snapshots in flight
    // (a Refresh click during an event's refresh) each emptying the list and appending after their reads
    // showed a grant twice, or a card without its meters for a moment
    const cards: HTMLElement[] = [];
    const generation = ++this.grantsGeneration;
    let cost = 0;
    if (grants.length === 0) {
      this.grants.replaceChildren(el('p', { class: 'jp-relay-empty' }, 'No notebook has a grant yet.'));
      this.costToday = 0;
      this.emitSummary();
      return;
    }
    for (const grant of grants) {
      let usage = '';
      const meters = el('div', { class: 'jp-relay-meters' });
      try {
        // budget.get answers {origin, usage: {tokens, cost_usd, tokens_limit, cost_limit, ...}} (docs/protocol.md)
        const got = (await this.client.call('budget.get', { origin: grant.origin }))?.usage;
        const line = usageLine(got);
        cost += line.cost;
        usage = line.text;
        for (const meter of budgetMeters(got)) {
          meters.append(meterRow(meter));
        }
        // the day limits of the profiles the grant caps (usage.profiles: only with profile_budgets), read-only
        for (const capped of profileBudgets(got)) {
          const block = el('div', { class: 'jp-relay-profile' },
            el('div', { class: 'jp-relay-profile-line', title: visible(capped.text) }, capped.text));
          for (const meter of capped.meters) {
            block.append(meterRow(meter));
          }
          meters.append(block);
        }
        // the teams the notebook's user draws from with it (usage.teams: only where teams are configured)
        for (const team of teamBudgets(got)) {
          const block = el('div', { class: 'jp-relay-team' },
            el('div', { class: 'jp-relay-team-line', title: visible(team.text) }, team.text));
          for (const meter of team.meters) {
            block.append(meterRow(meter));
          }
          meters.append(block);
        }
      } catch {
        usage = '';
      }
      const revoke = el('button', { class: 'jp-mod-styled jp-mod-warn' }, 'Revoke');
      revoke.onclick = async () => {
        await this.client.call('grants.revoke', { origin: grant.origin });
        await this.refresh();
      };
      const tools = (grant.tools ?? []).join(', ') || '(none)';
      // the notebook's saved "Always allow" answers, each with Forget (trust.revoke of that exact key)
      const always = el('div', { class: 'jp-relay-trust' });
      for (const t of trust.filter(t => t && t.origin === grant.origin)) {
        const forget = el('button', { class: 'jp-mod-styled jp-relay-trust-forget' }, 'Forget');
        forget.onclick = async () => {
          forget.disabled = true;
          try {
            await this.client.call('trust.revoke', { origin: grant.origin, server: String(t.server ?? ''), tool: t.tool });
          } catch (err) {
            always.append(el('div', { class: 'jp-relay-error' }, String((err as Error).message)));
          }
          await this.refresh();
        };
        always.append(el('div', { class: 'jp-relay-trust-row' },
          el('span', { class: 'jp-relay-trust-name' }, `always allowed: ${t.name ?? t.tool}`), forget));
      }
      cards.push(
        el(
          'div',
          { class: 'jp-relay-grant' },
          el('div', { class: 'jp-relay-card-title jp-relay-clip', title: visible(String(grant.origin ?? '')) },
            String(grant.origin ?? '')),
          el('div', {}, `tools: ${tools}`),
          el('div', {}, usage),
          meters,
          always,
          revoke
        )
      );
    }
    if (generation !== this.grantsGeneration) {
      return; // a newer snapshot's grants are (or will be) shown
    }
    this.grants.replaceChildren(...cards);
    this.costToday = cost;
    this.emitSummary();
  }

  private auditFilter = el('input', {
    class: 'jp-relay-audit-filter jp-mod-styled',
    type: 'search',
    placeholder: 'filter: tool:NAME decision:deny notebook:folder/ or words',
    'aria-label': 'Filter the recent decisions'
  });

  // one query per pause in typing (a box's own timer)
  private filterChanged(list: string, reload: () => Promise<void>): void {
    if (this.filterTimers[list] !== undefined) {
      window.clearTimeout(this.filterTimers[list]);
    }
    this.filterTimers[list] = window.setTimeout(() => {
      delete this.filterTimers[list];
      void reload();
    }, FILTER_DEBOUNCE_MS);
  }

  // the newest AUDIT_TAIL records matching the filter's broker terms (in the log, however old), or the error
  private async queryAudit(): Promise<{ records: any[]; error: string | null }> {
    const params = auditParams(parseFilter(this.auditFilter.value), AUDIT_TAIL, this.scope);
    try {
      return { records: (await this.client.call('audit.tail', params)).records ?? [], error: null };
    } catch (err) {
      return { records: [], error: err instanceof RelayError ? err.message : String(err) };
    }
  }

  private async reloadAudit(): Promise<void> {
    const generation = ++this.auditGeneration;
    const got = await this.queryAudit();
    if (generation === this.auditGeneration) {
      this.renderAudit(got); // an answer to an older filter is dropped
    }
  }

  // the runs shown: the newest of every notebook, or those the filter's origin terms select (in the journal)
  private async queryRuns(): Promise<{ runs: any[]; error: string | null } | null> {
    const params = runsParams(parseFilter(this.runsFilter.value), RUNS_COUNTED, this.scope);
    if (params.origin_prefix === undefined) {
      return null; // the unfiltered newest runs (refresh's own list)
    }
    try {
      return { runs: (await this.client.call('runs.list', params)).runs ?? [], error: null };
    } catch (err) {
      return { runs: [], error: err instanceof RelayError ? err.message : String(err) };
    }
  }

  private async reloadRuns(): Promise<void> {
    const generation = ++this.runsGeneration;
    const got = await this.queryRuns();
    if (generation === this.runsGeneration) {
      this.renderRuns(got);
    }
  }

  private renderAudit(got: { records: any[]; error: string | null }): void {
    this.lastAudit = got;
    this.audit.replaceChildren();
    if (got.error !== null) {
      this.audit.append(el('p', { class: 'jp-relay-error' }, `Decisions unavailable: ${got.error}`));
      return;
    }
    const filter = parseFilter(this.auditFilter.value);
    const records = got.records.filter(record => recordMatches(record, filter, this.scope, 'audit'));
    const table = el('table', { class: 'jp-relay-audit-table' });
    table.append(
      el('tr', {}, el('th', {}, 'time'), el('th', {}, 'notebook'), el('th', {}, 'tool'), el('th', {}, 'decision'),
        el('th', {}, 'code'))
    );
    for (const record of records.slice(-AUDIT_SHOWN).reverse()) {
      table.append(
        el(
          'tr',
          { class: 'jp-relay-audit-row' },
          el('td', { class: 'jp-relay-time' }, timeOf(record.ts)),
          el('td', { class: 'jp-relay-notebook', title: visible(String(record.origin ?? '')) }, notebookOf(record.origin)),
          el('td', {}, record.tool),
          el('td', {}, record.decision),
          el('td', {}, record.code ?? '')
        )
      );
    }
    this.audit.append(table);
    if (records.length === 0 && this.auditFilter.value.trim()) {
      this.audit.append(el('p', { class: 'jp-relay-empty' }, 'No decision matches the filter.'));
    }
  }

  private renderRuns(filtered: { runs: any[]; error: string | null } | null): void {
    // the latest runs of every notebook (runs.list from the browser: all origins), or those of the filter's
    // notebooks; a running one with Cancel. The status bar counts the running ones among the latest of all.
    this.lastRuns = filtered;
    this.runs.replaceChildren();
    this.emitSummary();
    if (filtered?.error) {
      this.runs.append(el('p', { class: 'jp-relay-error' }, `Runs unavailable: ${filtered.error}`));
      return;
    }
    const filter = parseFilter(this.runsFilter.value);
    const runs = (filtered?.runs ?? this.latestRuns).filter(run => recordMatches(run, filter, this.scope, 'run'))
      .slice(0, RUNS_SHOWN);
    if (runs.length === 0) {
      this.runs.append(el('p', { class: 'jp-relay-empty' },
        this.runsFilter.value.trim() ? 'No run matches the filter.' : 'No runs yet.'));
      return;
    }
    // one small card per run (a five-column table cut the Cancel button off at the panel's default width)
    for (const run of runs) {
      const model = run.meta && typeof run.meta === 'object' ? String(run.meta.model ?? '') : '';
      const state = el('div', {},
        el('span', { class: 'jp-relay-time' }, timeOf(run.started_at)), ' · ',
        el('span', { class: 'jp-relay-run-state' }, String(run.state ?? '')));
      const card = el(
        'div',
        { class: 'jp-relay-item jp-relay-run', 'data-run-id': String(run.run_id ?? ''), title: String(run.run_id ?? '') },
        el('div', { class: 'jp-relay-card-title jp-relay-clip' },
          el('span', { class: 'jp-relay-notebook', title: visible(String(run.origin ?? '')) }, notebookOf(run.origin)),
          model ? ' · ' : '', el('span', { class: 'jp-relay-run-model' }, model)),
        state
      );
      if (run.state === 'running') {
        const cancel = el('button', { class: 'jp-mod-styled jp-mod-warn jp-relay-cancel' }, 'Cancel');
        cancel.onclick = async () => {
          cancel.disabled = true;
          try {
            await this.client.call('runs.cancel', { run_id: run.run_id });
          } catch (err) {
            card.append(el('div', { class: 'jp-relay-error' }, String((err as Error).message)));
          }
          await this.refresh();
        };
        state.append(' ', cancel);
      }
      this.runs.append(card);
    }
  }
}

// The side panel's model: pure functions of what the broker sends (no DOM, no JupyterLab), so they are
// unit-tested under plain Node (labextension/test/model.test.mjs, run by tests/kernel/test_panel_model.py).

// C0/C1 controls and the bidi overrides/isolates of "Trojan Source" (plus zero-width and direction
// marks), shown as <U+XXXX> so a tool name or argument cannot reorder or hide what a person approves;
// the kernel's cards do the same (relay_jupyter/core/visible.py, strict). ZWJ/ZWNJ are kept. Also ARABIC
// LETTER MARK, LINE/PARAGRAPH SEPARATOR, the format characters that show as nothing (U+180E, U+FFF9-FFFB),
// COMBINING GRAPHEME JOINER and the Hangul fillers (red team, tests/attack/test_invisible_text.py).
const INVISIBLE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\u061c\u2028\u2029\u180e\ufff9-\ufffb\u034f\u115f\u1160\u3164\uffa0]/g;

export function visible(text: string): string {
  return text
    .replace(/\r\n?/g, '\n')
    .replace(INVISIBLE, ch => `<U+${ch.charCodeAt(0).toString(16).toUpperCase().padStart(4, '0')}>`);
}

// "notebook:analysis/sales.ipynb" -> "analysis/sales.ipynb"; other origins (daemon:..., kernel:anon-...) as they are
export function notebookOf(origin: string | null | undefined): string {
  const text = String(origin ?? '');
  return text.startsWith('notebook:') ? text.slice('notebook:'.length) : text;
}

// epoch seconds -> local "HH:MM:SS" today, "YYYY-MM-DD HH:MM" on another day ("" when absent)
export function timeOf(ts: unknown, now: Date = new Date()): string {
  const seconds = Number(ts);
  if (!Number.isFinite(seconds) || seconds <= 0) {
    return '';
  }
  const when = new Date(seconds * 1000);
  const pad = (n: number) => String(n).padStart(2, '0');
  const clock = `${pad(when.getHours())}:${pad(when.getMinutes())}`;
  if (when.toDateString() === now.toDateString()) {
    return `${clock}:${pad(when.getSeconds())}`;
  }
  return `${when.getFullYear()}-${pad(when.getMonth() + 1)}-${pad(when.getDate())} ${clock}`;
}

// the answer buttons of a request: Approve/Deny always, the wider scopes only when the broker offers them
// (`scopes` absent: all three; a malformed list: once only; `run_code` offers once only) -- the same rule as
// the kernel's card (relay_jupyter/kernel/widgets/consent_card.py, offered_scopes)
const CHOICES: [string, string, string][] = [
  ['Approve', 'allow', 'once'],
  ['Deny', 'deny', 'once'],
  ['Allow for this run', 'allow', 'run'],
  ['Always allow for this notebook', 'allow', 'notebook']
];

export function offeredScopes(scopes: unknown): string[] {
  if (scopes === undefined || scopes === null) {
    return ['once', 'run', 'notebook'];
  }
  if (!Array.isArray(scopes)) {
    return ['once'];
  }
  return ['once', 'run', 'notebook'].filter(s => s === 'once' || scopes.includes(s));
}

export function offeredChoices(scopes: unknown): [string, string, string][] {
  const offered = offeredScopes(scopes);
  return CHOICES.filter(([, , scope]) => offered.includes(scope));
}

// an audit record matches the filter when any of its shown columns contains every word of it (case-folded)
export function auditMatches(record: any, filter: string): boolean {
  const words = filter.toLowerCase().split(/\s+/).filter(w => w);
  if (words.length === 0) {
    return true;
  }
  const hay = [notebookOf(record?.origin), record?.origin, record?.tool, record?.decision, record?.code]
    .map(v => String(v ?? '').toLowerCase())
    .join('\n');
  return words.every(w => hay.includes(w));
}

// budget.get's usage -> "1,086 of 200,000 tokens, $0.0226 of $5.00 today" (words and numbers, never JSON)
export function usageLine(usage: any): { text: string; cost: number } {
  const u = usage && typeof usage === 'object' ? usage : {};
  const tokens = Number(u.tokens ?? 0);
  const spent = Number(u.cost_usd ?? 0);
  const cost = Number.isFinite(spent) ? spent : 0;
  const ofTokens = u.tokens_limit == null ? '' : ` of ${Number(u.tokens_limit).toLocaleString('en-US')}`;
  const ofCost = u.cost_limit == null ? '' : ` of $${Number(u.cost_limit).toFixed(2)}`;
  const shownTokens = Number.isFinite(tokens) ? tokens.toLocaleString('en-US') : '0';
  return { text: `${shownTokens}${ofTokens} tokens, $${cost.toFixed(4)}${ofCost} today`, cost };
}

// the budget meters of a grant: tokens and estimated cost used today against the day limits (a limit the
// grant does not have gets no meter); `fraction` is clamped to [0, 1], `over` says the limit is reached
export interface IMeter {
  label: string;
  used: number;
  limit: number;
  fraction: number;
  over: boolean;
}

export function budgetMeters(usage: any): IMeter[] {
  const u = usage && typeof usage === 'object' ? usage : {};
  const out: IMeter[] = [];
  for (const [label, usedKey, limitKey] of [
    ['tokens today', 'tokens', 'tokens_limit'],
    ['cost today (USD)', 'cost_usd', 'cost_limit']
  ]) {
    const limit = Number(u[limitKey]);
    if (u[limitKey] == null || !Number.isFinite(limit) || limit <= 0) {
      continue;
    }
    const raw = Number(u[usedKey] ?? 0);
    const used = Number.isFinite(raw) && raw > 0 ? raw : 0;
    out.push({ label, used, limit, fraction: Math.min(1, used / limit), over: used >= limit });
  }
  return out;
}

// the team budgets of a notebook (issue 15 item 3): budget.get's `usage.teams` (present only where teams are
// configured, docs/multi-user.md), one entry per team its user belongs to: "team NAME: 1,086 of 50,000 tokens,
// $0.0226 of $10.00 today · 48,914 tokens, $9.97 left" and a meter per day limit the team has (a team without
// limits: the line only). `team` is the broker's string as it is: the panel shows it through a text node only.
export interface ITeamBudget {
  team: string;
  text: string;
  meters: IMeter[];
}

// what a team's or a profile's budget row has left today ("48,914 tokens", "$9.97"), one word per limit it has
function leftWords(row: any): string[] {
  const left: string[] = [];
  const leftTokens = Number(row.remaining_tokens);
  if (row.remaining_tokens != null && Number.isFinite(leftTokens)) {
    left.push(`${Math.max(0, leftTokens).toLocaleString('en-US')} tokens`);
  }
  const leftCost = Number(row.remaining_cost_usd);
  if (row.remaining_cost_usd != null && Number.isFinite(leftCost)) {
    left.push(`$${Math.max(0, leftCost).toFixed(2)}`);
  }
  return left;
}

export function teamBudgets(usage: any): ITeamBudget[] {
  const teams = usage && typeof usage === 'object' && Array.isArray(usage.teams) ? usage.teams : [];
  const out: ITeamBudget[] = [];
  for (const row of teams) {
    if (!row || typeof row !== 'object') {
      continue;
    }
    const day = row.day && typeof row.day === 'object' ? row.day : {};
    const left = leftWords(row);
    const team = String(row.team ?? '');
    const text = `team ${team}: ${usageLine(day).text}${left.length ? ` · ${left.join(', ')} left` : ' (no limit)'}`;
    const meters = budgetMeters(day).map(m => ({ ...m, label: `team ${m.label}` }));
    out.push({ team, text, meters });
  }
  return out;
}

// requests per session (issue 16 item 4): the telemetry rows (`telemetry.query`, one per model request through
// relay/anthropic, relay/openai or a %%agent turn) grouped by (origin, session), newest session first. A row
// without a session (none was resolved) is its own group per origin and source.
export interface ISessionSummary {
  origin: string;
  session: string;
  source: string;
  requests: number;
  tokens: number;
  cost: number;
  errors: number;
  lineage: { [kind: string]: number };
  models: string[];
  first: number;
  last: number;
}

const LINEAGE_ORDER = ['new', 'continuation', 'compaction', 'undo', 'diverged'];

function count(value: unknown): number {
  const n = Number(value ?? 0);
  return Number.isFinite(n) && n > 0 ? n : 0;
}

export function sessionsOf(rows: unknown): ISessionSummary[] {
  const groups = new Map<string, ISessionSummary>();
  for (const row of Array.isArray(rows) ? rows : []) {
    if (!row || typeof row !== 'object') {
      continue;
    }
    const r = row as any;
    const origin = String(r.origin ?? '');
    const source = String(r.source ?? '');
    const session = r.session == null || r.session === '' ? '' : String(r.session);
    const key = JSON.stringify([origin, session, session ? '' : source]);
    const ts = count(r.ts);
    let s = groups.get(key);
    if (!s) {
      s = { origin, session, source, requests: 0, tokens: 0, cost: 0, errors: 0, lineage: {}, models: [],
        first: ts, last: ts };
      groups.set(key, s);
    }
    s.requests += 1;
    s.tokens += count(r.input_tokens) + count(r.output_tokens) + count(r.cache_read_tokens) +
      count(r.cache_write_tokens);
    s.cost += count(r.cost_usd);
    if (r.status != null && r.status !== 'ok') {
      s.errors += 1;
    }
    if (r.lineage != null && r.lineage !== '') {
      const kind = String(r.lineage);
      s.lineage[kind] = (s.lineage[kind] ?? 0) + 1;
    }
    const model = String(r.model ?? '');
    if (model && !s.models.includes(model)) {
      s.models.push(model);
    }
    if (source && !s.source.split(', ').includes(source)) {
      s.source = s.source ? `${s.source}, ${source}` : source;
    }
    if (ts > 0 && (s.first === 0 || ts < s.first)) {
      s.first = ts;
    }
    s.last = Math.max(s.last, ts);
  }
  return Array.from(groups.values()).sort((a, b) => b.last - a.last);
}

// a session's lineage counts in words: "new 1 · continuation 3 · undo 1" (the known kinds in their order, then
// any other kind a newer broker sends, by name); "" when no request was classified
export function lineageLine(lineage: { [kind: string]: number } | null | undefined): string {
  const counts = lineage && typeof lineage === 'object' ? lineage : {};
  const kinds = [...LINEAGE_ORDER.filter(k => k in counts), ...Object.keys(counts).filter(k => !LINEAGE_ORDER.includes(k)).sort()];
  return kinds.filter(k => count(counts[k]) > 0).map(k => `${k} ${count(counts[k])}`).join(' · ');
}

// a session id as shown: a fingerprint or hash cut to its first 12 hex digits, anything else as it is
// (bounded: a session id is at most a short identifier, docs/telemetry.md); "(none)" when absent
export function sessionLabel(session: string | null | undefined): string {
  const text = String(session ?? '');
  if (!text) {
    return '(none)';
  }
  const m = /^(fp:|sha256:)([0-9a-f]{12})[0-9a-f]*$/.exec(text);
  if (m) {
    return `${m[1]}${m[2]}…`;
  }
  return text.length > 40 ? `${text.slice(0, 39)}…` : text;
}

// The lists' filter (runs, recent decisions). The broker applies some terms while it reads its store
// (docs/protocol.md `runs.list` / `audit.tail`: `origin_prefix`, `tool`, `decision`), so a filtered list finds
// rows older than the newest 1000; the panel applies the plain words to what it was sent:
//   tool:NAME        exact tool name (`tool:run_code`, `tool:model:claude-x`)
//   decision:WORD    exact decision (`decision:deny`)
//   notebook:PATH    notebooks whose path starts with PATH (a folder `reports/`, or one notebook)
//   origin:PREFIX    origins starting with PREFIX as the broker writes them (`daemon:`, `kernel:anon-`)
//   other words      each must appear (case-folded) in the notebook, origin, tool, decision or code shown
// A term given twice: the last one counts. An empty value (`tool:`) is a plain word.
export interface IListFilter {
  tool: string | null;
  decision: string | null;
  notebook: string | null;
  origin: string | null;
  words: string;
}

const TERMS = ['tool', 'decision', 'notebook', 'origin'] as const;

export function parseFilter(filter: string): IListFilter {
  const out: IListFilter = { tool: null, decision: null, notebook: null, origin: null, words: '' };
  const words: string[] = [];
  for (const word of String(filter ?? '').split(/\s+/).filter(w => w)) {
    const cut = word.indexOf(':');
    const key = cut > 0 ? word.slice(0, cut).toLowerCase() : '';
    const value = cut > 0 ? word.slice(cut + 1) : '';
    if ((TERMS as readonly string[]).includes(key) && value) {
      out[key as (typeof TERMS)[number]] = value;
    } else {
      words.push(word);
    }
  }
  out.words = words.join(' ');
  return out;
}

// A hub user's panel sees only origins under its `user:<name>/` (and the broker refuses another prefix): the
// prefix every origin the panel was shown lies under, or '' (a single-user server: no such prefix, or mixed).
export function scopePrefix(origins: unknown[]): string {
  let prefix: string | null = null;
  for (const origin of origins) {
    const m = /^(user:[^/]+\/)/.exec(String(origin ?? ''));
    if (!m || (prefix !== null && prefix !== m[1])) {
      return '';
    }
    prefix = m[1];
  }
  return prefix ?? '';
}

// the origin prefix a filter asks the broker for ("" none): `notebook:PATH` -> `<scope>notebook:PATH`,
// `origin:P` -> P (under the hub user's scope unless it already names it)
export function originPrefixOf(filter: IListFilter, scope = ''): string | null {
  if (filter.origin !== null) {
    return scope && !filter.origin.startsWith(scope) ? `${scope}${filter.origin}` : filter.origin;
  }
  if (filter.notebook !== null) {
    return `${scope}notebook:${filter.notebook}`;
  }
  return null;
}

// `audit.tail`'s params for a filter (the bounds are the protocol's: tool <= 512, decision <= 64 characters;
// a longer term matches nothing, so it is left to the panel's words and the broker is not asked with it)
export function auditParams(filter: IListFilter, n: number, scope = ''): { [key: string]: any } {
  const params: { [key: string]: any } = { n };
  const prefix = originPrefixOf(filter, scope);
  if (prefix !== null && prefix.length <= 4096) {
    params.origin_prefix = prefix;
  }
  if (filter.tool !== null && filter.tool.length <= 512) {
    params.tool = filter.tool;
  }
  if (filter.decision !== null && filter.decision.length <= 64) {
    params.decision = filter.decision;
  }
  return params;
}

// `runs.list`'s params for a filter: a run has an origin, no tool or decision (those terms do not narrow runs)
export function runsParams(filter: IListFilter, limit: number, scope = ''): { [key: string]: any } {
  const params: { [key: string]: any } = { limit };
  const prefix = originPrefixOf(filter, scope);
  if (prefix !== null && prefix.length <= 4096) {
    params.origin_prefix = prefix;
  }
  return params;
}

// a run matches the plain words of a filter when each appears in its notebook, origin, model or state
export function runMatches(run: any, words: string): boolean {
  const wanted = String(words ?? '').toLowerCase().split(/\s+/).filter(w => w);
  if (wanted.length === 0) {
    return true;
  }
  const model = run?.meta && typeof run.meta === 'object' ? run.meta.model : '';
  const hay = [notebookOf(run?.origin), run?.origin, model, run?.state, run?.run_id]
    .map(v => String(v ?? '').toLowerCase())
    .join('\n');
  return wanted.every(w => hay.includes(w));
}

// the day budgets of the profiles a grant caps (issue 16 item 6; budget.get's `usage.profiles`, only when the
// grant has `profile_budgets`): "profile team: 1,086 of 50,000 tokens, $0.0226 of $10.00 today · 48,914 tokens,
// $9.97 left" and a meter per limit; read-only (a limit changes only with a fresh consent). `profile` is the
// broker's string as it is: the panel shows it through a text node only.
export interface IProfileBudget {
  profile: string;
  text: string;
  meters: IMeter[];
}

export function profileBudgets(usage: any): IProfileBudget[] {
  const rows = usage && typeof usage === 'object' && Array.isArray(usage.profiles) ? usage.profiles : [];
  const out: IProfileBudget[] = [];
  for (const row of rows) {
    if (!row || typeof row !== 'object') {
      continue;
    }
    const profile = String(row.profile ?? '');
    const left = leftWords(row);
    const text = `profile ${profile}: ${usageLine(row).text}${left.length ? ` · ${left.join(', ')} left` : ''}`;
    const meters = budgetMeters(row).map(m => ({ ...m, label: `profile ${m.label}` }));
    out.push({ profile, text, meters });
  }
  return out;
}

// a record (audit) or run matches a whole filter: its broker terms (applied again here, so what is shown while a
// new query is in flight already fits) and its plain words
export function recordMatches(record: any, filter: IListFilter, scope = '', kind: 'audit' | 'run' = 'audit'): boolean {
  const prefix = originPrefixOf(filter, scope);
  if (prefix !== null && !String(record?.origin ?? '').startsWith(prefix)) {
    return false;
  }
  if (kind === 'audit') {
    if (filter.tool !== null && String(record?.tool ?? '') !== filter.tool) {
      return false;
    }
    if (filter.decision !== null && String(record?.decision ?? '') !== filter.decision) {
      return false;
    }
    return auditMatches(record, filter.words);
  }
  return runMatches(record, filter.words);
}

// The side panel's model: pure functions of what the broker sends (no DOM, no JupyterLab), so they are
// unit-tested under plain Node (labextension/test/model.test.mjs, run by tests/kernel/test_panel_model.py).

// C0/C1 controls and the bidi overrides/isolates of "Trojan Source" (plus zero-width and direction
// marks), shown as <U+XXXX> so a tool name or argument cannot reorder or hide what a person approves;
// the kernel's cards do the same (relay_jupyter/kernel/rendering.py, visible()). ZWJ/ZWNJ are kept.
const INVISIBLE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]/g;

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

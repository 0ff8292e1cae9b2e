// Unit tests of the side panel's model (labextension/src/model.ts, compiled to lib/model.js by `jlpm build:lib`).
// Plain Node (node:test), no JupyterLab: run by tests/kernel/test_panel_model.py.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { auditMatches, notebookOf, offeredChoices, offeredScopes, timeOf, usageLine, visible } from '../lib/model.js';

test('visible shows bidi and control characters as code points and keeps ZWJ', () => {
  assert.equal(visible('a\u202egnp.exe'), 'a<U+202E>gnp.exe');
  assert.equal(visible('\x1b[31mred'), '<U+001B>[31mred');
  assert.equal(visible('x\r\ny\rz'), 'x\ny\nz');
  assert.equal(visible('tab\tnew\nline'), 'tab\tnew\nline');
  assert.equal(visible('\u200b\u2066\ufeff'), '<U+200B><U+2066><U+FEFF>');
  assert.equal(visible('👩\u200d💻'), '👩\u200d💻');
  assert.equal(visible('<img src=x onerror=alert(1)>'), '<img src=x onerror=alert(1)>');
});

test('notebookOf strips the notebook: prefix only', () => {
  assert.equal(notebookOf('notebook:a/b.ipynb'), 'a/b.ipynb');
  assert.equal(notebookOf('daemon:kernel:x'), 'daemon:kernel:x');
  assert.equal(notebookOf(null), '');
  assert.equal(notebookOf(undefined), '');
});

test('timeOf is a local clock time today and a local date otherwise, never an epoch float', () => {
  const now = new Date(2026, 11, 1, 15, 0, 0);
  const today = new Date(2026, 11, 1, 9, 5, 7).getTime() / 1000;
  const before = new Date(2026, 10, 30, 23, 59, 0).getTime() / 1000;
  assert.equal(timeOf(today, now), '09:05:07');
  assert.equal(timeOf(before, now), '2026-11-30 23:59');
  assert.equal(timeOf(String(today + 0.25), now), '09:05:07');
  for (const bad of [null, undefined, 'x', -1, 0, NaN, Infinity]) {
    assert.equal(timeOf(bad, now), '');
  }
});

test('offered scopes: all when absent, once only when malformed, never what the broker did not offer', () => {
  assert.deepEqual(offeredScopes(undefined), ['once', 'run', 'notebook']);
  assert.deepEqual(offeredScopes(null), ['once', 'run', 'notebook']);
  assert.deepEqual(offeredScopes(['once']), ['once']);
  assert.deepEqual(offeredScopes([]), ['once']);
  assert.deepEqual(offeredScopes('run notebook'), ['once']);
  assert.deepEqual(offeredScopes({ run: true }), ['once']);
  assert.deepEqual(offeredScopes(['notebook', 'bogus']), ['once', 'notebook']);
  const labels = offeredChoices(['once']).map(([label]) => label);
  assert.deepEqual(labels, ['Approve', 'Deny']); // run_code: one call at a time
  assert.deepEqual(offeredChoices(undefined).map(([, d, s]) => `${d}:${s}`),
    ['allow:once', 'deny:once', 'allow:run', 'allow:notebook']);
});

test('the audit filter matches every word in notebook, tool, decision or code, case-folded', () => {
  const record = { origin: 'notebook:sales/Q3.ipynb', tool: 'scratch_push', decision: 'deny', code: 'CONSENT_DENIED' };
  assert.ok(auditMatches(record, ''));
  assert.ok(auditMatches(record, '   '));
  assert.ok(auditMatches(record, 'q3'));
  assert.ok(auditMatches(record, 'push DENY'));
  assert.ok(auditMatches(record, 'consent_denied'));
  assert.ok(!auditMatches(record, 'allow'));
  assert.ok(!auditMatches(record, 'push allow'));
  assert.ok(!auditMatches({}, 'x'));
  assert.ok(auditMatches({ tool: null, decision: undefined }, ''));
});

test('the budget line is words and numbers from usage, never raw JSON', () => {
  assert.deepEqual(usageLine({ tokens: 1086, cost_usd: 0.0226, tokens_limit: 200000, cost_limit: 5 }),
    { text: '1,086 of 200,000 tokens, $0.0226 of $5.00 today', cost: 0.0226 });
  assert.deepEqual(usageLine({ tokens: 0, cost_usd: 0 }), { text: '0 tokens, $0.0000 today', cost: 0 });
  assert.deepEqual(usageLine(undefined), { text: '0 tokens, $0.0000 today', cost: 0 });
  assert.equal(usageLine({ tokens: 'x', cost_usd: 'y' }).text, '0 tokens, $0.0000 today');
  assert.ok(!usageLine({ tokens: 5, cost_usd: 1 }).text.includes('{'));
});

test('budget meters: one per day limit, clamped, over when the limit is reached', async () => {
  const { budgetMeters } = await import('../lib/model.js');
  assert.deepEqual(budgetMeters({ tokens: 50, tokens_limit: 200, cost_usd: 6, cost_limit: 5 }), [
    { label: 'tokens today', used: 50, limit: 200, fraction: 0.25, over: false },
    { label: 'cost today (USD)', used: 6, limit: 5, fraction: 1, over: true }
  ]);
  assert.deepEqual(budgetMeters({ tokens: 50, tokens_limit: null, cost_usd: 1 }), []);
  assert.deepEqual(budgetMeters({ tokens: -3, tokens_limit: 10 }).map(m => m.used), [0]);
  assert.deepEqual(budgetMeters({ tokens: 'x', tokens_limit: 'y' }), []);
  assert.deepEqual(budgetMeters(undefined), []);
});

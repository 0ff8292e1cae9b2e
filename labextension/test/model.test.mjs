// Unit tests of the side panel's model (labextension/src/model.ts, compiled to lib/model.js by `jlpm build:lib`).
// Plain Node (node:test), no JupyterLab: run by tests/kernel/test_panel_model.py.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  auditMatches, auditParams, notebookOf, offeredChoices, offeredScopes, parseFilter, profileBudgets, recordMatches, runMatches, runsParams,
  scopePrefix, timeOf, usageLine, visible
} from '../lib/model.js';

test('visible shows bidi and control characters as code points and keeps ZWJ', () => {
  assert.equal(visible('a\u202egnp.exe'), 'a<U+202E>gnp.exe');
  assert.equal(visible('\x1b[31mred'), '<U+001B>[31mred');
  assert.equal(visible('x\r\ny\rz'), 'x\ny\nz');
  assert.equal(visible('tab\tnew\nline'), 'tab\tnew\nline');
  assert.equal(visible('\u200b\u2066\ufeff'), '<U+200B><U+2066><U+FEFF>');
  assert.equal(visible('a\u061cb\u2028c\u180e\ufffa\u034f\u3164'),
    'a<U+061C>b<U+2028>c<U+180E><U+FFFA><U+034F><U+3164>');
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

test('sessions: requests per (origin, session) with tokens, cost, lineage and failures, newest first', async () => {
  const { sessionsOf, lineageLine, sessionLabel } = await import('../lib/model.js');
  const row = (over) => ({ origin: 'notebook:a.ipynb', source: 'proxy', model: 'claude-x', session: 's1',
    lineage: 'continuation', input_tokens: 10, output_tokens: 5, cache_read_tokens: 1, cache_write_tokens: 2,
    cost_usd: 0.5, status: 'ok', ts: 100, ...over });
  const rows = [
    row({ lineage: 'new', ts: 100 }),
    row({ ts: 110 }),
    row({ ts: 120, lineage: 'undo', status: 'upstream_error', model: 'claude-y' }),
    // the same session id in another notebook is another session
    row({ origin: 'notebook:b.ipynb', ts: 105, lineage: 'new' }),
    // a %%agent turn: its session is the conversation, no lineage
    row({ source: 'agent', session: 'default', lineage: null, ts: 130, cost_usd: 0.25 }),
    // no session: one group per origin and source, never merged with a named one
    row({ session: null, lineage: null, ts: 90 }),
    'garbage', null, 7
  ];
  const got = sessionsOf(rows);
  assert.deepEqual(got.map(s => [s.origin, s.session, s.requests]), [
    ['notebook:a.ipynb', 'default', 1], ['notebook:a.ipynb', 's1', 3], ['notebook:b.ipynb', 's1', 1],
    ['notebook:a.ipynb', '', 1]]);
  const s1 = got[1];
  assert.equal(s1.tokens, 3 * 18);
  assert.equal(s1.cost, 1.5);
  assert.equal(s1.errors, 1);
  assert.deepEqual(s1.lineage, { new: 1, continuation: 1, undo: 1 });
  assert.deepEqual(s1.models, ['claude-x', 'claude-y']);
  assert.deepEqual([s1.first, s1.last], [100, 120]);
  assert.equal(lineageLine(s1.lineage), 'new 1 · continuation 1 · undo 1');
  assert.equal(lineageLine(got[0].lineage), '');
  // a kind a newer broker sends is kept, by name, after the known ones; bad counts are dropped
  assert.equal(lineageLine({ zeta: 2, compaction: 1, diverged: 'x', new: -1 }), 'compaction 1 · zeta 2');
  assert.equal(lineageLine(undefined), '');
  // bad figures count as zero, never NaN
  const bad = sessionsOf([{ origin: 'o', session: 'x', input_tokens: 'many', cost_usd: -3, ts: 'y' }]);
  assert.deepEqual([bad[0].tokens, bad[0].cost, bad[0].requests, bad[0].last], [0, 0, 1, 0]);
  assert.deepEqual(sessionsOf(undefined), []);
  assert.deepEqual(sessionsOf({ rows: [] }), []);
  assert.equal(sessionLabel('fp:0123456789abcdef0123456789abcdef'), 'fp:0123456789ab…');
  assert.equal(sessionLabel('sha256:0123456789abcdef0123456789abcdef'), 'sha256:0123456789ab…');
  assert.equal(sessionLabel('my-session'), 'my-session');
  assert.equal(sessionLabel(''), '(none)');
  assert.equal(sessionLabel(null), '(none)');
  assert.equal(sessionLabel('x'.repeat(100)).length, 40);
});

test('team budgets: none without usage.teams, a line and day meters per team, a line only without limits', async () => {
  const { teamBudgets } = await import('../lib/model.js');
  // no teams configured: budget.get has no `teams` key; garbage is no team either
  assert.deepEqual(teamBudgets({ tokens: 5, tokens_limit: 10 }), []);
  assert.deepEqual(teamBudgets(undefined), []);
  assert.deepEqual(teamBudgets({ teams: [] }), []);
  assert.deepEqual(teamBudgets({ teams: 'data' }), []);
  assert.deepEqual(teamBudgets({ teams: [null, 7, 'x'] }), []);
  // one team with day limits (the shape of core/budgets.py team_usage)
  const day = (over) => ({ key: '2026-12-01', tokens: 1086, cost_usd: 0.0226, reserved_tokens: 0,
    reserved_cost_usd: 0, tokens_limit: 50000, cost_limit: 10, ...over });
  const one = teamBudgets({ teams: [{ team: 'data-science', day: day({}), month: day({ key: '2026-12' }),
    remaining_tokens: 48914, remaining_cost_usd: 9.9774 }] });
  assert.deepEqual(one, [{
    team: 'data-science',
    text: 'team data-science: 1,086 of 50,000 tokens, $0.0226 of $10.00 today · 48,914 tokens, $9.98 left',
    meters: [
      { label: 'team tokens today', used: 1086, limit: 50000, fraction: 1086 / 50000, over: false },
      { label: 'team cost today (USD)', used: 0.0226, limit: 10, fraction: 0.00226, over: false }
    ]
  }]);
  // a team without limits: its usage, no meter, "(no limit)"; a spent team: its meter over, 0 left
  const two = teamBudgets({ teams: [
    { team: 'open', day: day({ tokens_limit: null, cost_limit: null }), remaining_tokens: null, remaining_cost_usd: null },
    { team: 'spent', day: day({ tokens: 60000 }), remaining_tokens: 0, remaining_cost_usd: null }
  ] });
  assert.equal(two[0].text, 'team open: 1,086 tokens, $0.0226 today (no limit)');
  assert.deepEqual(two[0].meters, []);
  assert.equal(two[1].text, 'team spent: 60,000 of 50,000 tokens, $0.0226 of $10.00 today · 0 tokens left');
  assert.deepEqual(two[1].meters.map(m => [m.label, m.fraction, m.over]),
    [['team tokens today', 1, true], ['team cost today (USD)', 0.00226, false]]);
  // a month-only limit: the line says what is left, no day meter; bad figures are never NaN
  const month = teamBudgets({ teams: [{ team: 'm', day: day({ tokens_limit: null, cost_limit: null }),
    remaining_tokens: 'x', remaining_cost_usd: 4 }] });
  assert.equal(month[0].text, 'team m: 1,086 tokens, $0.0226 today · $4.00 left');
  assert.deepEqual(month[0].meters, []);
  assert.equal(teamBudgets({ teams: [{ team: 'z', day: 'bad' }] })[0].text, 'team z: 0 tokens, $0.0000 today (no limit)');
  // the name is the broker's string as it is (the panel shows it through a text node, visible())
  const hostile = '<img src=x onerror=alert(1)>\u202e';
  assert.equal(teamBudgets({ teams: [{ team: hostile, day: day({}) }] })[0].team, hostile);
  assert.ok(!teamBudgets({ teams: [{ team: {}, day: {} }] })[0].text.includes('{'));
});

test('a filter splits into the terms the broker applies and the words the panel applies', () => {
  const f = parseFilter('  tool:run_code Decision:deny notebook:reports/ q4  SALES ');
  assert.deepEqual(f, { tool: 'run_code', decision: 'deny', notebook: 'reports/', origin: null, words: 'q4 SALES' });
  assert.deepEqual(parseFilter(''), { tool: null, decision: null, notebook: null, origin: null, words: '' });
  // an empty value, an unknown key and a colon inside a value
  assert.deepEqual(parseFilter('tool: code:X tool:model:claude-x'),
    { tool: 'model:claude-x', decision: null, notebook: null, origin: null, words: 'tool: code:X' });
  assert.deepEqual(parseFilter('origin:daemon: tool:a tool:b').tool, 'b'); // the last one counts
  assert.deepEqual(auditParams(f, 200), { n: 200, origin_prefix: 'notebook:reports/', tool: 'run_code', decision: 'deny' });
  assert.deepEqual(auditParams(parseFilter('just words'), 200), { n: 200 });
  assert.deepEqual(auditParams(parseFilter('origin:daemon:'), 50), { n: 50, origin_prefix: 'daemon:' });
  // beyond the protocol's bounds a term is not sent (the broker would refuse the whole call)
  assert.deepEqual(auditParams(parseFilter(`tool:${'x'.repeat(513)} decision:${'d'.repeat(65)}`), 9), { n: 9 });
  assert.deepEqual(runsParams(f, 100), { limit: 100, origin_prefix: 'notebook:reports/' });
  assert.deepEqual(runsParams(parseFilter('tool:run_code'), 100), { limit: 100 });
});

test('a hub user\'s scope goes before the filter\'s notebook path, never twice', () => {
  assert.equal(scopePrefix(['user:alice/notebook:a.ipynb', 'user:alice/kernel:anon-1']), 'user:alice/');
  assert.equal(scopePrefix(['user:alice/notebook:a.ipynb', 'user:bob/notebook:b.ipynb']), '');
  assert.equal(scopePrefix(['notebook:a.ipynb', 'user:alice/notebook:b.ipynb']), '');
  assert.equal(scopePrefix([]), '');
  assert.equal(scopePrefix([null, undefined]), '');
  const scoped = auditParams(parseFilter('notebook:reports/'), 10, 'user:alice/');
  assert.equal(scoped.origin_prefix, 'user:alice/notebook:reports/');
  assert.equal(auditParams(parseFilter('origin:user:alice/kernel:'), 10, 'user:alice/').origin_prefix,
    'user:alice/kernel:');
  assert.equal(auditParams(parseFilter('origin:kernel:'), 10, 'user:alice/').origin_prefix, 'user:alice/kernel:');
});

test('a run matches the plain words in its notebook, model or state', () => {
  const run = { run_id: 'run_1', origin: 'notebook:reports/q4.ipynb', state: 'done', meta: { model: 'claude-x' } };
  assert.ok(runMatches(run, ''));
  assert.ok(runMatches(run, 'Q4 done'));
  assert.ok(runMatches(run, 'claude'));
  assert.ok(!runMatches(run, 'running'));
  assert.ok(runMatches({}, '') && !runMatches({}, 'x') && !runMatches(null, 'x'));
});

test('profile budgets: a line and a meter per day limit, read-only figures of usage.profiles', () => {
  const usage = { tokens: 5, profiles: [
    { profile: 'team', tokens: 1086, cost_usd: 0.0226, tokens_limit: 50000, cost_limit: 10, remaining_tokens: 48914,
      remaining_cost_usd: 9.9774 },
    { profile: 'local', tokens: 70, cost_usd: 0, tokens_limit: 60, cost_limit: null, remaining_tokens: 0,
      remaining_cost_usd: null },
    null, 'x'] };
  const [team, local, ...rest] = profileBudgets(usage);
  assert.equal(rest.length, 0);
  assert.equal(team.text, 'profile team: 1,086 of 50,000 tokens, $0.0226 of $10.00 today · 48,914 tokens, $9.98 left');
  assert.deepEqual(team.meters.map(m => [m.label, m.used, m.limit, m.over]),
    [['profile tokens today', 1086, 50000, false], ['profile cost today (USD)', 0.0226, 10, false]]);
  assert.equal(local.text, 'profile local: 70 of 60 tokens, $0.0000 today · 0 tokens left');
  assert.deepEqual(local.meters.map(m => [m.label, m.over, m.fraction]), [['profile tokens today', true, 1]]);
  assert.deepEqual(profileBudgets({}), []);
  assert.deepEqual(profileBudgets(null), []);
  assert.deepEqual(profileBudgets({ profiles: 'no' }), []);
  assert.equal(profileBudgets({ profiles: [{ profile: '<img src=x>' }] })[0].text, 'profile <img src=x>: 0 tokens, $0.0000 today');
});

test('the whole filter is applied to what is shown, terms exactly, words as words', () => {
  const old = { origin: 'notebook:reports/q3.ipynb', tool: 'scratch_push', decision: 'deny', code: 'CONSENT_DENIED' };
  const f = parseFilter('tool:scratch_push decision:deny notebook:reports/ q3');
  assert.ok(recordMatches(old, f));
  assert.ok(!recordMatches(old, parseFilter('tool:scratch')));           // exact, not a substring
  assert.ok(!recordMatches(old, parseFilter('decision:allow')));
  assert.ok(!recordMatches(old, parseFilter('notebook:q3.ipynb')));      // a path prefix
  assert.ok(!recordMatches(old, parseFilter('tool:scratch_push zzz')));
  assert.ok(!recordMatches(old, parseFilter('notebook:reports/'), 'user:alice/')); // under the hub user's scope only
  assert.ok(recordMatches({ ...old, origin: 'user:alice/notebook:reports/q3.ipynb' }, parseFilter('notebook:reports/'),
    'user:alice/'));
  const run = { origin: 'notebook:reports/q3.ipynb', state: 'done' };
  assert.ok(recordMatches(run, parseFilter('notebook:reports/ done tool:ignored-for-runs'), '', 'run'));
  assert.ok(!recordMatches(run, parseFilter('notebook:other/'), '', 'run'));
});

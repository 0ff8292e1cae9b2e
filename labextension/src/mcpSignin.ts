// "Sign in to <server>": the side panel's part of OAuth sign-in to HTTP MCP servers (docs/mcp.md, "OAuth sign-in").
// The broker lists the servers that sign in with OAuth here (`mcp.sign_ins`); a server that needs it gets a
// button that starts the flow (`mcp.sign_in`), then a link to the authorization server's page. relay never opens
// that page itself: the link opens only when the person clicks it (a new tab, noopener noreferrer). The redirect
// lands on the Jupyter server's relay/mcp-oauth/callback route; this section waits (`mcp.sign_in_wait`) and says
// when it is done. No token ever reaches the browser: the broker keeps them.
// Plain DOM, text nodes only (a server name or message is never parsed as HTML), as in panel.ts.
import { visible } from './model';
import { RelayClient, RelayError } from './rpc';

export interface ISignInEntry {
  server: string;
  host: string;
  state: 'needs_sign_in' | 'pending' | 'signed_in' | 'unavailable' | 'not_connected';
  has_token: boolean;
  sign_in_id: string | null;
  authorization_url: string | null;
  message: string;
}

/** The authorization page's link, or null when it is not an absolute https (or loopback http) URL. */
export function signInLink(url: unknown): URL | null {
  if (typeof url !== 'string') {
    return null;
  }
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return null;
  }
  const loopback = ['localhost', '127.0.0.1', '[::1]'].includes(parsed.hostname) ||
    /^127\.\d+\.\d+\.\d+$/.test(parsed.hostname);
  if (parsed.username || parsed.password) {
    return null;
  }
  if (parsed.protocol === 'https:' || (parsed.protocol === 'http:' && loopback)) {
    return parsed;
  }
  return null;
}

function node<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: { [key: string]: string } = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const n = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    n.setAttribute(key, value);
  }
  for (const child of children) {
    n.append(typeof child === 'string' ? document.createTextNode(visible(child)) : child);
  }
  return n;
}

const WAIT_SECONDS = 25;

/**
 * The "Sign in to <server>" section. `node` is empty (and hidden) when no server signs in with OAuth here;
 * call `refresh()` with the panel's refresh, `dispose()` when the panel goes.
 */
export class McpSignInSection {
  readonly node = node('div', { class: 'jp-relay-signins' });
  private entries: ISignInEntry[] = [];
  private waiting = new Set<string>();
  private notes = new Map<string, string>();
  private disposed = false;

  constructor(private client: RelayClient) {
    this.node.hidden = true;
  }

  dispose(): void {
    this.disposed = true;
  }

  async refresh(): Promise<void> {
    try {
      const result = await this.client.call('mcp.sign_ins');
      this.entries = result.servers ?? [];
    } catch {
      this.entries = []; // no MCP registry, or the broker is down: the panel's status line says so
    }
    this.render();
    for (const entry of this.entries) {
      if (entry.state === 'pending' && entry.sign_in_id) {
        void this.wait(entry.server, entry.sign_in_id);
      }
    }
  }

  private render(): void {
    this.node.replaceChildren();
    const shown = this.entries.filter(e => e.state !== 'signed_in' || this.notes.has(e.server));
    this.node.hidden = shown.length === 0;
    if (shown.length === 0) {
      return;
    }
    this.node.append(node('h3', {}, 'MCP sign-in'));
    for (const entry of shown) {
      this.node.append(this.card(entry));
    }
  }

  private card(entry: ISignInEntry): HTMLElement {
    const card = node('div', { class: 'jp-relay-signin', 'data-server': entry.server });
    card.append(node('div', { class: 'jp-relay-signin-title' }, `MCP server ${entry.server}`,
      entry.host ? ` (${entry.host})` : ''));
    const note = this.notes.get(entry.server);
    if (entry.state === 'pending') {
      const link = signInLink(entry.authorization_url);
      if (link === null) {
        card.append(node('div', { class: 'jp-relay-error' }, 'the authorization link is not https: not shown'));
      } else {
        const a = node('a', {
          class: 'jp-relay-signin-link', href: link.href, target: '_blank', rel: 'noopener noreferrer'
        }, `Open the sign-in page (${link.host})`);
        card.append(a, node('div', { class: 'jp-relay-signin-note' },
          'Sign in there; this panel says when it is done. relay keeps the token in the broker.'));
      }
    } else if (entry.state !== 'signed_in') {
      const button = node('button', { class: 'jp-relay-signin-button jp-mod-styled' }, `Sign in to ${entry.server}`);
      button.onclick = () => void this.start(entry.server, button);
      card.append(button);
      if (entry.message && entry.state === 'unavailable') {
        card.append(node('div', { class: 'jp-relay-signin-note' }, entry.message));
      }
    }
    if (note) {
      card.append(node('div', { class: 'jp-relay-signin-result' }, note));
    }
    return card;
  }

  private async start(server: string, button: HTMLButtonElement): Promise<void> {
    button.disabled = true;
    this.notes.delete(server);
    try {
      const started = await this.client.call('mcp.sign_in', { server });
      if (started.state === 'signed_in') {
        this.notes.set(server, `✓ signed in to ${server}`);
      } else if (started.state === 'failed') {
        this.notes.set(server, `sign-in failed: ${started.message}`);
      }
    } catch (err) {
      this.notes.set(server, `sign-in failed: ${err instanceof RelayError ? err.message : String(err)}`);
    }
    await this.refresh();
  }

  private async wait(server: string, signInId: string): Promise<void> {
    if (this.waiting.has(signInId)) {
      return;
    }
    this.waiting.add(signInId);
    try {
      while (!this.disposed) {
        const r = await this.client.call('mcp.sign_in_wait', { sign_in_id: signInId, timeout: WAIT_SECONDS });
        if (r.state !== 'pending') {
          this.notes.set(server, r.state === 'signed_in' ? `✓ ${r.message || `signed in to ${server}`}`
            : `sign-in failed: ${r.message}`);
          break;
        }
      }
    } catch (err) {
      this.notes.set(server, `sign-in failed: ${err instanceof RelayError ? err.message : String(err)}`);
    } finally {
      this.waiting.delete(signInId);
    }
    if (!this.disposed) {
      await this.refresh();
    }
  }
}

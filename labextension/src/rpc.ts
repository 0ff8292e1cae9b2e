// JSON-RPC and SSE client for the relay broker, over the Jupyter server's own authentication
// (ServerConnection adds the token / XSRF header). The broker treats this page as a *browser*
// caller: it may answer permission requests and revoke grants for origins its user owns.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export class RelayError extends Error {
  constructor(
    message: string,
    readonly code: string | null
  ) {
    super(message);
  }
}

export interface IRelayEvent {
  id: number;
  ts: number;
  type: string;
  origin: string | null;
  run_id: string | null;
  data: { [key: string]: any };
}

let nextId = 1;

export class RelayClient {
  readonly settings = ServerConnection.makeSettings();

  private url(path: string): string {
    return URLExt.join(this.settings.baseUrl, 'relay', path);
  }

  async call<T = any>(method: string, params: { [key: string]: any } = {}): Promise<T> {
    const response = await ServerConnection.makeRequest(
      this.url('rpc'),
      {
        method: 'POST',
        body: JSON.stringify({ jsonrpc: '2.0', id: nextId++, method, params }),
        headers: { 'Content-Type': 'application/json' }
      },
      this.settings
    );
    if (!response.ok) {
      throw new RelayError(`relay broker answered HTTP ${response.status}`, null);
    }
    const body = await response.json();
    if (body.error) {
      const code = body.error.data?.code ?? null;
      throw new RelayError(body.error.message, code);
    }
    return body.result as T;
  }

  /**
   * Follow the event stream, calling `onEvent` for each event, until `signal` aborts. `since` null
   * starts live (the broker's current state comes from RPC snapshots, not from replaying the log);
   * a reconnect asks for everything after the last id seen, so nothing is missed across a drop.
   */
  async follow(
    since: number | null,
    onEvent: (event: IRelayEvent) => void,
    signal: AbortSignal
  ): Promise<void> {
    let last = since;
    while (!signal.aborted) {
      try {
        const response = await ServerConnection.makeRequest(
          this.url(last === null ? 'events' : `events?since=${last}`),
          { method: 'GET', signal },
          this.settings
        );
        if (!response.ok || !response.body) {
          throw new Error(`HTTP ${response.status}`);
        }
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        let buffer = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) {
            break;
          }
          buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, '\n');
          let cut: number;
          while ((cut = buffer.indexOf('\n\n')) >= 0) {
            const frame = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            const data = frame
              .split('\n')
              .filter(line => line.startsWith('data:'))
              .map(line => line.slice(5).replace(/^ /, ''))
              .join('\n');
            if (data) {
              const event = JSON.parse(data) as IRelayEvent;
              if (typeof event.id === 'number') {
                last = Math.max(last ?? 0, event.id);
              }
              onEvent(event);
            }
          }
        }
      } catch (err) {
        if (signal.aborted) {
          return;
        }
      }
      await new Promise(resolve => setTimeout(resolve, 2000));
    }
  }
}

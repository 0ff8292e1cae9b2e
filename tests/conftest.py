"""Suite-wide fixtures. Each test that starts a server stops it; everything listens on 127.0.0.1."""

pytest_plugins = ("pytest_jupyter.jupyter_server",)

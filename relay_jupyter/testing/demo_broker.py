"""Moved to :mod:`relay_jupyter.notebook_broker` (it runs the real daemon; it is not a test double). This
name stays so that older notebooks and tests keep working."""

from ..notebook_broker import *  # noqa: F403
from ..notebook_broker import __all__  # noqa: F401

"""Fixtures of the core tests."""

from __future__ import annotations

import pytest
from core_support import Rig, make_rig


@pytest.fixture
def rig() -> Rig:
    return make_rig()

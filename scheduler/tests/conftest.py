"""Fixtures for the scheduler's Python tests (the helpers they share: scheduler_helpers.py)."""

import pytest
from lightspeed_scheduler import Scheduler
from scheduler_helpers import make_scheduler


@pytest.fixture
def scheduler() -> Scheduler:
    return make_scheduler()

"""Shared pytest fixtures."""

from tests.daemon import *  # noqa
from tests.fixtures_models import *  # noqa

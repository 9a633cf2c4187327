"""Shared pytest fixtures."""

from tests.fixtures_models import *  # noqa

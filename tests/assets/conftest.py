"""Fixtures for the asset tests: a temporary K3 home, its resources, and the smoke data group
materialized once per module into an ephemeral instance."""

import dagster as dg
import pytest

from assets import data
from pipelines.resources import resources_for


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("k3home")


@pytest.fixture(scope="module")
def smoke_resources(home):
    return resources_for(home)


@pytest.fixture(scope="module")
def data_run(smoke_resources):
    """(instance, result) of materializing smoke/corpus, tokenizer, clue_data and image_data."""
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(data.build("smoke"), instance=instance, resources=smoke_resources)
    assert result.success
    return instance, result


def error_text(exc: BaseException) -> str:
    """Every message in an exception's chain (Dagster wraps the user's error in its own)."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(str(exc))
        exc = getattr(exc, "user_exception", None) or exc.__cause__ or exc.__context__
    return "\n".join(parts)

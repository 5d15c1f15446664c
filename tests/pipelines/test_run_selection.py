"""`k3 run` materializes only what is missing or stale for its profile; `--force` redoes the rest."""

import pytest

from pipelines.cli import main


@pytest.fixture
def home(tmp_path, monkeypatch):
    # `k3 run` exports these; monkeypatch restores them after the test.
    for var in ("K3_HOME", "DAGSTER_HOME", "K3_PROFILE"):
        monkeypatch.setenv(var, "")
    monkeypatch.setenv("K3_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_rerun_skips_what_is_done_and_force_redoes_it(home, capsys):
    assert main(["run", "--profile", "smoke", "--select", "corpus"]) == 0
    assert "✓ corpus" in capsys.readouterr().out
    assert main(["run", "--profile", "smoke", "--select", "corpus,image_data"]) == 0
    out = capsys.readouterr().out
    assert "up to date for profile smoke, skipped: corpus (--force redoes them)" in out
    assert "image_data: never materialized for profile 'smoke'" in out
    assert "✓ image_data" in out and "▶ corpus" not in out
    assert main(["run", "--profile", "smoke", "--select", "corpus"]) == 0
    assert "nothing to materialize" in capsys.readouterr().out
    assert main(["run", "--profile", "smoke", "--select", "corpus", "--force"]) == 0
    assert "✓ corpus" in capsys.readouterr().out

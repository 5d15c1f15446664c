"""A task's progress line (`assets.ray_task.LiveLog`): the headline metrics when present, otherwise
the step's first few figures — never an empty line (claim 5's comparison arms printed "step 0: ")."""

from assets.ray_task import LiveLog


def test_progress_lines_show_headline_metrics_or_the_steps_own(tmp_path, capsys):
    progress = tmp_path / "progress.log"
    log = LiveLog("tiny/x", progress_path=str(progress))
    log(3, {"train/main": 2.5, "compare/seed0/bf16/nll": 6.0, "step": 3})
    log(0, {"compare/seed0/ceil/qat/nll": 6.031, "compare/seed0/ceil/qat/drop": 0.004, "note": "text"})
    lines = progress.read_text().splitlines()
    assert lines == ["[tiny/x] step 3: train/main=2.5",
                     "[tiny/x] step 0: compare/seed0/ceil/qat/nll=6.031, compare/seed0/ceil/qat/drop=0.004"]
    assert capsys.readouterr().out.splitlines() == lines

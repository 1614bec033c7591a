"""``tandem bench shapes --beam-size N``: plain and assisted beam search at a model's shapes, the oracle drafting
from plain beam search's own tree, the assisted output equal to plain's."""

from __future__ import annotations

import pytest


@pytest.mark.slow  # three minutes on 2 shared cores: random models built, transformers' beam search timed
def test_beam_mode_is_exact_and_its_oracle_drafts_plain_beam_search(tmp_path):
    from pipelines.quality.bench_shapes import bench_shapes

    printed = []
    report = bench_shapes("whisper-base", tokens=12, acceptances=(1.0, 0.0), lookaheads=(3,), beam_size=3,
                          json_path=str(tmp_path / "shapes.json"), log=printed.append)
    kept, steps = report["beam_steps"]
    assert report["beam_size"] == 3 and steps == 12 and 0 <= kept < steps  # the first step branches from one prompt
    rows = {r["system"]: r for r in report["rows_out"]}
    perfect, wrong = rows["tandem assisted, acceptance 1.0"], rows["tandem assisted, acceptance 0.0"]
    assert perfect["identical"] is True and wrong["identical"] is True
    assert wrong["tokens_per_call"] == 1.0  # every draft wrong: one step a pass, as plain
    assert perfect["tokens_per_call"] >= 1.0
    assert any("beam steps drafted at best" in line for line in printed)
    assert (tmp_path / "shapes.json").exists()

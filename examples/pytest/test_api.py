"""gradnorm from a Python test: gradnorm.run returns the report, one Row per scenario x variant
(python/gradnorm/__init__.py). This test passes: it asserts that the oracle catches the bug."""

import os

import gradnorm

HERE = os.path.dirname(os.path.abspath(__file__))


def test_mean_of_means_is_caught_on_a_ragged_window():
    report = gradnorm.run(step="steps/mean_of_means.py", cwd=HERE,
                          scenarios=["single/n3/float32", "single/accum2-ragged/float32"])
    assert report.row("single/n3/float32", "py/mean_of_means").met   # one micro-batch: right
    row = report.row("single/accum2-ragged/float32", "py/mean_of_means")
    assert row.verdict == "fail" and row.figures["rel_l2_error"] > 0.1, row.explain()
    assert any("gradients rel L2 error" in reason for reason in row.reasons)

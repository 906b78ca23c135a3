import re

from evaluation.report import PLOTS, write_report


def _result():
    model = {"miou": 0.4, "r1@0.5": 0.5, "n": 2, "parse_failure_rate": 0.5, "eval_loss": 1.2}
    base = {"miou": 0.2, "r1@0.5": 0.0, "n": 2}
    return {"checkpoint": "/x/step-000010", "checkpoint_name": "step-000010", "step": 10, "split": "val",
            "select_metric": "r1@0.5", "summary": {
                "model": model, "baselines": {"prior": base, "blank": base},
                "visual_gain": {"miou": 0.2, "r1@0.5": 0.5}, "by_length": {"short": model},
                "by_source": {"synthetic": model}, "counts": {"samples": 1, "queries": 2, "scored": 2, "skipped": {}}}}


def test_report_html_references_images_that_exist(tmp_path):
    preds = [{"key": "v.0#0", "query": "q <b>", "gt": [[1.0, 3.0]], "raw": "1 - 3 seconds", "pred": [1.0, 3.0],
              "iou": 0.8, "duration_s": 10.0, "blank_iou": 0.0},
             {"key": "v.0#1", "query": "q2", "gt": [[0.0, 1.0], [5, 6]], "raw": "??", "pred": None, "iou": 0.0,
              "duration_s": 10.0, "blank_iou": 0.0}]
    steps = [{"step": 0, "miou": 0.1, "r1@0.5": 0.0}, {"step": 10, "miou": 0.4, "r1@0.5": 0.5}]
    html_path = write_report(tmp_path / "r", _result(), preds, steps, [0.5], samples=5)
    html = html_path.read_text()
    images = re.findall(r'<img src="([^"]+)"', html)
    assert sorted(images) == sorted(PLOTS)
    assert all((html_path.parent / i).read_bytes()[:4] == b"\x89PNG" for i in images)
    assert "q &lt;b&gt;" in html and "visual gain" in html and "50.0%" in html


def test_scoring_alone_does_not_import_matplotlib():
    """pyplot is imported at the first plot (`vtg.util.pyplot`): an evaluation process that scores and reuses stored
    reports (selection, a cached per-checkpoint evaluation) does not pay its 1-2 s of import."""
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, evaluation.api, evaluation.select; print(sorted(m for m in sys.modules if 'matplotlib' in m))"
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"

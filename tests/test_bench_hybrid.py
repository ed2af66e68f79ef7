"""bench/hybrid.py on a tiny Qwen3.5 layout with an MTP layer: every figure it reports,
measured for real (the numbers of a tiny model mean nothing, their presence does)."""

import json
import sys

from bench import hybrid
from specllama.models.synthetic import write_synthetic


def test_the_report_has_every_figure(tmp_path, monkeypatch, capsys):
    target = tmp_path / "tiny-qwen3.5.gguf"
    write_synthetic(target, "tiny-qwen3.5", early=0, late=0.05, ftype="F32")
    out = tmp_path / "report.json"
    monkeypatch.setattr(sys, "argv", ["hybrid", "--target", str(target), "--threads", "1",
                                      "--reps", "1", "--max-tokens", "8", "--json", str(out)])
    hybrid.main()
    report = json.loads(out.read_text())
    assert report["memory"] == "hybrid"
    mib = report["recurrent_state_mib"]
    assert mib["n_rs_seq=8"] > mib["n_rs_seq=0"] > 0  # the snapshots' memory
    assert set(report["T(k+1)/T(1)"]) == {str(k) for k in hybrid.KS}
    assert report["mtp_step/target_step"] > 0  # a timing: its size is not asserted
    assert set(report["generation"]) == {"0.0", "0.8"}
    assert "auto_mean_draft_length" in report["generation"]["0.0"]
    assert json.loads(capsys.readouterr().out) == report

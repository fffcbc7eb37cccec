import csv
import functools
import importlib.util
import json
import os

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "ldp_audit.py")


def load_example():
    spec = importlib.util.spec_from_file_location("ldp_audit_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_writes_csv_png_and_passes_its_checks(tmp_path, capsys, monkeypatch):
    example = load_example()
    # one fixed run: the example's audits, cohorts and noise are secret, and its checks (20
    # intervals at a family-wise 5%) failed a correct run about 1 time in 160
    monkeypatch.setattr(example, "LDPAudit", functools.partial(example.LDPAudit, seed=0))
    monkeypatch.setattr(example, "DPFedAvg", functools.partial(example.DPFedAvg, sampling_seed=0,
                                                               reproducible_noise=True))
    out = example.main(["--quick", "--epsilons", "0.5", "4", "--out", str(tmp_path)])
    assert out["ok"], out["checks"]
    for key in ("reach", "gradient_flip", "closed_form", "flags"):
        assert out["checks"][key] == [], key
    with open(out["csv"], encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    # 2 eps0 x 2 audits (rounds 2 and 4) x 5 adversaries
    assert len(rows) == 2 * 2 * 5
    assert {r["adversary"] for r in rows} == set(example.ADVERSARY_NAMES)
    assert {float(r["epsilon0_claimed"]) for r in rows} == {0.5, 4.0}
    for r in rows:
        assert float(r["epsilon0_lower_bound"]) <= float(r["epsilon0"])
        assert r["flagged"] == "False"
    # no value of a real example: the crafted pairs' norms and closed-form values stay in memory
    assert not {"norm_g1", "norm_g2", "cosine_g1_g2", "epsilon0_expected", "client"} & set(rows[0])
    with open(out["png"], "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    for eps0 in ("0.5", "4"):
        assert os.path.exists(os.path.join(str(tmp_path), f"eps0_{eps0}", "version_0", "ldp_audit_summary.json"))
    printed = capsys.readouterr().out
    assert "[PASS] dummy and collusion reach eps0" in printed
    assert "[FAIL]" not in printed
    assert "real client updates clipped to L" in printed
    assert "client gradient norms seen" not in printed
    # 4 rounds x 10 clients: 40 real updates seen, fewer than the block published (100): the
    # share is withheld, and the summary and the print say so with the real count
    for eps0 in ("0.5", "4"):
        path = os.path.join(str(tmp_path), f"eps0_{eps0}", "version_0", "ldp_audit_summary.json")
        with open(path, encoding="utf-8") as fh:
            summary = json.load(fh)
        reason = "fewer than 100 client updates (40 seen): not published"
        assert summary["results"]["client_updates_at_clip"] == {"status": f"skipped: {reason}"}
        norms = summary["client_update_norms"]
        assert (norms["count"], norms["seen"], norms["client_updates_at_clip"]) == (0, 40, None)
    assert printed.count(f"eps0=4: {reason}") == 1
    assert "None of 0 updates" not in printed

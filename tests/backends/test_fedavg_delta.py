"""DP-FedAvg's claim is at the audit's delta: ``CanaryAudit(delta=...)`` different from the
module's own ``delta`` gives the Gaussian mechanism composed over the most-sampled canary's
rounds at the audit's delta, the delta every sentence then states (before, the module's delta
was used while the sentences said the audit's)."""

from __future__ import annotations

import json
import warnings

from audit_callbacks import names
from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.estimators import gaussian_epsilon
from tests._federated import digits_dpfedavg, fit


def test_the_claim_is_at_the_audits_delta_not_the_modules(tmp_path):
    dm, module = digits_dpfedavg(rounds_per_epoch=4)
    assert module.delta != 1e-3
    audit = CanaryAudit(30, 30, delta=1e-3, bootstrap=0, log_figures=False, log_histograms=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(dm, module, [audit], 8, tmp_path)
    with open(audit.summary_path, encoding="utf-8") as fh:
        summary = json.load(fh)
    max_part = summary["max_participations"]  # the most-sampled canary's rounds
    assert max_part >= 1
    claim = summary[names.EPSILON_ANALYTIC]
    z = float(module.noise_multiplier)
    assert claim == gaussian_epsilon(z, 1e-3, compositions=int(max_part))
    assert claim != gaussian_epsilon(z, module.delta, compositions=int(max_part))
    assert summary["inputs"]["delta"] == 1e-3
    assert "at delta = 0.001" in summary[f"{names.VERDICT_ALL_ITERATES}_sentence"]

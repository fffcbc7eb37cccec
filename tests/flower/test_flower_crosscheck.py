"""Cross-check: the same DP-FedAvg run through Flower (``CanaryStrategy`` around Flower's FedAvg
and server-side fixed-clipping DP wrapper) and through ``DPFedAvg`` + ``CanaryAudit``.

Same population (digits over 50 clients, the same shards), same cohort rule (20 of the 50 real
+ 150 canary clients, uniformly without replacement), same noise multiplier, clip norm, rounds,
model, local SGD and the same 150 Hadamard canaries (and 3,946 unobserved ones). Strict equality
is not expected: the two runs draw their cohorts (Flower's FedAvg with Python's ``random``,
``DPFedAvg``'s ``CohortSampler`` with numpy), their noise (Flower's DP wrapper with numpy's
global generator, ``DPFedAvg`` with a torch generator) and their local shuffles from different
generators, so the estimates are two draws of the same random variable. What is tested is what
that justifies: the two runs' 95% bootstrap intervals overlap, for both threat models and both
fits; the most-sampled canary's count (hence the analytic epsilon) is close; the observed
canaries' mean cosines are close. Observed at z = 0.6 (Flower vs DPFedAvg): final model 9.13
[5.55, 13.79] vs 5.89 [5.08, 9.85]; all iterates 16.20 [10.36, 22.48] vs 13.53 [8.21, 18.71];
equal-variance fits 4.89 [3.88, 5.98] vs 5.14 [4.23, 6.00] and 5.63 [4.30, 7.03] vs 6.54
[5.34, 7.68]; analytic 35.6 vs 32.8 (9 vs 8 participations).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg  # noqa: E402

from audit_callbacks.callbacks import CanaryAudit  # noqa: E402
from audit_callbacks.federated import DPFedAvg  # noqa: E402
from audit_callbacks.flower import CanaryStrategy, LocalGrid, local_sgd  # noqa: E402
from datamodules import FederatedDataModule  # noqa: E402
from models import MLP  # noqa: E402
from tests._federated import fit  # noqa: E402

N, K, M, Z, C, R, SEED = 50, 150, 20, 0.6, 1.0, 30, 0
LR, BATCH, DELTA = 0.1, 8, 1e-6


def _data():
    dm = FederatedDataModule("digits", num_clients=N, rounds_per_epoch=R, seed=SEED)
    dm.setup("fit")
    return dm


def _flower(dm, tmp_path):
    data = [(ds.tensors[0], ds.tensors[1]) for ds in dm.client_datasets]
    torch.manual_seed(SEED)
    model = MLP(64, 10, hidden=(32,))
    worker = MLP(64, 10, hidden=(32,))
    gen = torch.Generator().manual_seed(SEED + 1)

    def handler(msg, i):
        arrays, loss = local_sgd(worker, msg.content["arrays"], *data[i], lr=LR,
                                 batch_size=BATCH, generator=gen)
        return RecordDict({"arrays": arrays,
                           "metrics": MetricRecord({"num-examples": 1, "loss": loss})})

    random.seed(SEED)
    np.random.seed(SEED)
    fedavg = FedAvg(fraction_train=M / (N + K), fraction_evaluate=0.0, min_available_nodes=N)
    dp = DifferentialPrivacyServerSideFixedClipping(fedavg, Z, C, M)
    strategy = CanaryStrategy(dp, num_canaries=K, seed=SEED, delta=DELTA, bootstrap=200,
                              log_dir=str(tmp_path / "flower"))
    strategy.start(LocalGrid(N, handler), ArrayRecord(model.state_dict()), num_rounds=R)
    assert strategy.backend.inputs["clients_per_round"] == M
    return strategy.last_report


def _lightning(dm, tmp_path):
    torch.manual_seed(SEED)
    module = DPFedAvg(MLP(64, 10, hidden=(32,)), clients_per_round=M, noise_multiplier=Z,
                      clip_norm=C, local_lr=LR, local_batch_size=BATCH, server_lr=1.0,
                      server_momentum=0.0, sampling="uniform", delta=DELTA, seed=SEED,
                      reproducible_noise=True)
    audit = CanaryAudit(K, canaries="hadamard", seed=SEED, bootstrap=200, log_figures=False)
    fit(dm, module, [audit], R, tmp_path, name="lightning")
    return audit.last_report


def _overlap(a, b) -> bool:
    return a.lower <= b.upper and b.lower <= a.upper


@pytest.mark.filterwarnings("ignore:CanaryAudit. 150 canary clients outnumber")  # by design
def test_flower_and_dpfedavg_estimates_agree(tmp_path):
    dm = _data()
    flower, lightning = _flower(dm, tmp_path), _lightning(dm, tmp_path)
    assert flower.num_canaries_participated > 100 and lightning.num_canaries_participated > 100
    for name in ("epsilon_final_model", "epsilon_final_model_unequal_fit",
                 "epsilon_all_iterates_max_cosine"):
        a, b = flower.estimates[name], lightning.estimates[name]
        assert a.lower is not None and b.lower is not None, name
        assert _overlap(a, b), (name, a.value, (a.lower, a.upper), b.value, (b.lower, b.upper))
    # the known-rounds estimate composes over each run's own most-sampled canary (r_max differs
    # between the runs' cohorts): each is near its own analytic epsilon, and their per-round
    # shifts agree
    for report in (flower, lightning):
        est = report.estimates["epsilon_all_iterates_matched"]
        assert 0.75 < est.value / report.epsilon_analytic < 1.25, (est.value, report.epsilon_analytic)
    mu_f = flower.estimates["epsilon_all_iterates_matched"].details["per_round_mu"]
    mu_l = lightning.estimates["epsilon_all_iterates_matched"].details["per_round_mu"]
    assert mu_f == pytest.approx(mu_l, rel=0.2) and mu_f == pytest.approx(1 / Z, rel=0.2)
    # the cohorts are drawn at the same rate: close most-sampled counts and analytic epsilons
    assert abs(flower.max_participations - lightning.max_participations) <= 4
    assert flower.epsilon_analytic == pytest.approx(lightning.epsilon_analytic, rel=0.5)
    # and the canaries stand out of the null by similar margins in both
    for key in ("final_observed", "all_observed"):
        fa, la = flower.statistics[key].mean(), lightning.statistics[key].mean()
        assert fa == pytest.approx(la, rel=0.35), key

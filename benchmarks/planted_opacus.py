"""Opacus DP-SGD cases of ``benchmarks/planted_bugs.py`` (issue 25, cases a-c): per-example
clipping at 2C, noise at sigma / 2, a training loader sampling at 2q, each against the accountant
of the correct run, and the correct run itself.

One case is one plain-PyTorch Opacus run on scikit-learn's breast cancer (569 examples, z-scored)
with :class:`~audit_callbacks.plain.opacus_audit.OpacusCanaryAudit` (Hadamard canaries) on one CPU
thread: an MLP 30-255-1 (d = 8,161), ``make_private(poisson_sampling=True)`` with a loader of batch
64 (q = 64 / 569), sigma = SIGMA, C = 1, SGD, EPOCHS epochs, K observed canaries and the default
unobserved ones. The canaries enter before Opacus' per-example clipping and are drawn by the
training loader's own Poisson sampler (``canary_insertion`` / ``canary_sampling`` in the
summary). The planted bugs, which the accountant does not know about:

* ``opacus_clip_2c``: the optimizer's ``clip_and_accumulate`` runs with ``max_grad_norm``
  doubled (an instance override, set before the audit), noise and accountant at C;
* ``opacus_noise_half``: ``add_noise`` runs with ``noise_multiplier / 2``, the accountant's
  hook still reads sigma;
* ``opacus_sampling_2q``: the model trains on a ``DPDataLoader`` of rate 2q while
  ``make_private`` (and so the accountant) was given the loader of rate q.

The checks of the mechanism (``docs/methods/mechanism_checks.md``) meet four more bug classes
and two more correct set-ups:

* ``opacus_reused_noise``: the noise generator re-seeded before every step (the same noise
  vector each step);
* ``opacus_layer_without_noise``: the output layer's parameters get no noise;
* ``opacus_shuffled_batches``: ``DataLoader(shuffle=True)`` with ``poisson_sampling=False``,
  the accountant still assuming Poisson sampling at 1 / len(loader);
* ``opacus_seeded_global_generator``: no ``noise_generator``, so Opacus draws from torch's
  global generator, seeded with the run's public seed;
* ``opacus_momentum_correct`` (SGD with momentum 0.9) and ``opacus_adam_bmm_correct`` (Adam
  under ``BatchMemoryManager`` with physical batches of 16).

The correct set-ups seed their noise generator with a 64-bit number derived from the seed and
never logged (reproducible for the benchmark, not public to the noise-source check).

``CASES[name](seed)`` runs one seed (model initialisation, Poisson batches, DP noise and the
canaries all follow ``seed``) and returns a JSON-able dict: the verdict word of each threat
model (``audit_callbacks.auditing.html_report.verdict`` on the run's summary), the analytic
epsilon, every estimate with its interval, the valid lower bounds and the run's seconds.

    PYTHONPATH=. python benchmarks/planted_bugs.py --seeds 2 --correct-seeds 2 --cases opacus_correct  # a smoke run
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks.plain.opacus_audit import OpacusCanaryAudit
from benchmarks._planted import case_result
from datamodules.breast_cancer import load_breast_cancer_tensors
from models import MLP

__all__ = ["CASES", "run"]

BATCH, HIDDEN, SIGMA, CLIP, EPOCHS, K, LR, DELTA, BOOTSTRAP = 64, 255, 1.5, 1.0, 20, 400, 0.5, 1e-5, 100
BUGS = ("correct", "clip_2c", "noise_half", "sampling_2q", "reused_noise", "layer_without_noise",
        "shuffled_batches", "seeded_global_generator", "momentum_correct", "adam_bmm_correct")
#: a 64-bit noise seed per run, never logged: reproducible for the benchmark, not public
NOISE_SEED_SHIFT = 33


def _plant(opt: Any, bug: str) -> None:
    """Install ``bug`` on the optimizer instance (before the audit, which wraps what it finds)."""
    if bug == "clip_2c":
        clip = opt.clip_and_accumulate

        def clip_at_2c() -> None:
            c = opt.max_grad_norm
            opt.max_grad_norm = 2 * c
            try:
                clip()
            finally:
                opt.max_grad_norm = c

        opt.clip_and_accumulate = clip_at_2c
    elif bug == "noise_half":
        add_noise = opt.add_noise

        def half_noise() -> None:
            sigma = opt.noise_multiplier
            opt.noise_multiplier = sigma / 2
            try:
                add_noise()
            finally:
                opt.noise_multiplier = sigma  # the accountant's hook, after this, reads sigma

        opt.add_noise = half_noise
    elif bug == "reused_noise":  # the noise generator re-seeded before every step
        add_noise = opt.add_noise

        def same_noise() -> None:
            opt.generator = torch.Generator().manual_seed(1 << 40)
            add_noise()

        opt.add_noise = same_noise
    elif bug == "layer_without_noise":  # the output layer's parameters get no noise
        add_noise = opt.add_noise
        last = opt.params[-2:]

        def no_noise_on_the_output_layer() -> None:
            add_noise()
            for p in last:
                p.grad = p.summed_grad.view_as(p).clone()

        opt.add_noise = no_noise_on_the_output_layer


def run(seed: int, bug: str = "correct") -> dict[str, Any]:
    """One seed of the set-up above with ``bug`` (one of :data:`BUGS`).

    Raises:
        ValueError: an unknown ``bug``.
    """
    if bug not in BUGS:
        raise ValueError(f"bug must be one of {BUGS}, got {bug!r}")
    start = time.perf_counter()
    torch.set_num_threads(1)
    torch.manual_seed(seed)  # the model's initialisation (and, for one bug, the noise)
    x, y = load_breast_cancer_tensors()
    data = TensorDataset(x, y.float())
    net = MLP(30, 1, hidden=(HIDDEN,))
    if bug == "momentum_correct":
        optimizer = torch.optim.SGD(net.parameters(), lr=LR / 5, momentum=0.9)
    elif bug == "adam_bmm_correct":
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    shuffled = bug == "shuffled_batches"
    noise = {} if bug == "seeded_global_generator" else {
        "noise_generator": torch.Generator().manual_seed((10_000 + seed) << NOISE_SEED_SHIFT)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = PrivacyEngine().make_private(
            module=net, optimizer=optimizer,
            data_loader=DataLoader(data, batch_size=BATCH, shuffle=shuffled), noise_multiplier=SIGMA,
            max_grad_norm=CLIP, poisson_sampling=not shuffled, **noise)
        if bug == "sampling_2q":  # the model trains on a loader of rate 2q; the accountant has q
            loader = DPDataLoader(data, sample_rate=2 * loader.sample_rate,
                                  generator=torch.Generator().manual_seed(20_000 + seed))
        _plant(opt, bug)
        audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=K, seed=seed, delta=DELTA,
                                  bootstrap=BOOTSTRAP, canaries="hadamard")
        for _ in range(EPOCHS):
            batches = (BatchMemoryManager(data_loader=loader, max_physical_batch_size=16, optimizer=opt)
                       if bug == "adam_bmm_correct" else contextlib.nullcontext(loader))
            with batches as physical:
                for xb, yb in physical:
                    opt.zero_grad()
                    nn.functional.binary_cross_entropy_with_logits(
                        model(xb).squeeze(-1), yb, reduction="sum").div(BATCH).backward()
                    opt.step()
        report = audit.auditor.try_report(bootstrap=BOOTSTRAP, step=audit.steps)
        summary = audit.auditor.summary(report)
        audit.detach()
    inputs = summary["inputs"]
    return case_result(summary, seed=seed, start=start, bug=bug,
                       canary_insertion=inputs.get("canary_insertion"),
                       canary_sampling=inputs.get("canary_sampling"), steps=inputs.get("steps"))


CASES: dict[str, Callable[[int], dict[str, Any]]] = {
    f"opacus_{bug}": (lambda seed, bug=bug: run(seed, bug)) for bug in BUGS
}

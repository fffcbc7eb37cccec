"""``LDPInferenceAudit``: the LDP-FL inference attack of Varun et al. 2024 (§3.1), round by round.

Varun, Feng, Wang, Sural & Hong, CODASPY 2024, §3.1 (steps 1-4, eq. 2 and eq. 10) and its appendix; docs/methods/ldp.md, C5. Attach it to a
``Trainer`` that fits :class:`~audit_callbacks.federated.DPFedAvg` with a per-coordinate
randomizer that has a domain ``[c - r, c + r]`` (:class:`~audit_callbacks.mechanisms.TwoPoint`,
:class:`~audit_callbacks.mechanisms.Staircase`, :class:`~audit_callbacks.mechanisms.GRR`, ...).
Every round it plays the honest-but-curious server: it stores the rows the clients release
(``on_federated_randomized_updates``), predicts every coordinate of the clients' mean input over
the rounds so far with :class:`~audit_callbacks.attacks.LDPFLInferenceAttack`, and scores it.

What is attacked. DP-FedAvg randomizes each client's clipped update (not its weights, as in 002);
the attack's target is therefore the mean, over every row released so far, of what the mechanism
saw: ``randomizer.project(update)`` (clipped to the domain and, for grid mechanisms with
``rounding="nearest"``, rounded to the grid). Error metric (002 §3.2): ``|w_hat - w_mean| / (2r)``
per coordinate; the callback logs its mean and median over coordinates. Confidence (eq. 10):
``CS = 1 / (0.01 + |w_hat_2 - w_hat_1| / (2r))`` from two random halves of the history, in
(0, 100], mean over coordinates (from the second round on).

Modes (how the attacker turns released values into a prediction; both are logged by default):

* ``"debiased"``: the attack averages the server's own debiased values ``randomizer.debias(y)``.
  For the two-point mechanism debias is the identity and this is exactly eq. 2 (the mean of the
  released values). For GRR it is the affine inverse of the mean. For SRR (Staircase) the raw
  mean is biased towards the centre by an amount that depends on the unknown weight (002 §5,
  "Mitigating the risks"); but the bias is a fixed linear map of the output distribution, and
  ``Staircase.debias`` inverts it exactly (a per-value table) for every input outside the two
  edge blocks, so an attacker who knows the mechanism (as LDP assumes) still gets an unbiased
  prediction, at a higher variance. This is the attack we consider the right one.
* ``"raw"``: the plain mean of the released values (002's reading for SRR: the attacker applies
  eq. 2's "mean of outputs" without the mechanism's inverse). For the two-point mechanism it
  coincides with ``"debiased"``.

Logged (step = the round), per mode: ``ldp_inference/error_<mode>`` (mean over coordinates),
``ldp_inference/error_median_<mode>``, ``ldp_inference/error_max_<mode>``,
``ldp_inference/confidence_<mode>`` (mean CS). Every tag is ``names.tag("ldp_inference", name)``
(:mod:`audit_callbacks.names`), and ``name`` is also the key of the round's record (``history``)
and of the summary JSON written at fit end; the Custom Scalars layout (one chart of the errors,
one of the confidences) comes from :func:`audit_callbacks.names.chart_layout`.

State: ``state_dict`` holds the logged records only. The attack's target (a sum of the real
clients' un-randomized updates) stays in memory (docs/security.md), so a resumed run gets the
records up to the checkpoint back and then restarts the attack from the resumed round: its later
numbers cover only the rows released since the resume (``rows``) and differ from an
uninterrupted run's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from audit_callbacks import names
from audit_callbacks.attacks import LDPFLInferenceAttack
from audit_callbacks.auditing.output import ReportSection, result_entry, summary_document
from audit_callbacks.callbacks.summary import LightningOutput, output_summary_filename
from audit_callbacks.federated.dp_fedavg import DPFedAvgMixin
from audit_callbacks.federated.protocol import FederatedAuditHooks, FederatedRound
from audit_callbacks.validation import check_count, check_positive, check_real, check_seed

__all__ = ["INFERENCE_MODES", "LDPInferenceAudit"]

INFERENCE_MODES: tuple[str, ...] = ("debiased", "raw")
FAMILY = names.FAMILY_LDP_INFERENCE
#: The quantities logged per mode: ``names.tag(FAMILY, names.qualified(key, mode))``.
_KEYS = (names.ERROR_STEM, names.ERROR_MEDIAN_STEM, names.ERROR_MAX_STEM, names.CONFIDENCE_STEM)
SOURCE = ("Varun et al. 2024 §3.1 (inference attack on LDP-FL), eq. 2 and eq. 10; "
          "docs/methods/ldp.md, C5")


class LDPInferenceAudit(FederatedAuditHooks, Callback):
    """Per-round prediction error and confidence of the LDP-FL inference attack (Varun et al. 2024 §3.1).

    Args:
        center, radius: the domain ``[c - r, c + r]`` the error is relative to (default: the
            randomizer's ``center`` and ``radius``).
        modes: any of :data:`INFERENCE_MODES` (module docstring); default both.
        weights: indices of the coordinates to attack (default: all d). Memory: two
            ``rounds x len(weights)`` float64 arrays per mode.
        every_n_rounds: predict and log every n rounds (every round is observed regardless).
        seed: seed of the random halves (eq. 10).
        summary_filename: the JSON written at fit end in the logger's directory.

    Raises:
        ValueError: bad arguments (at construction).

    A module that is not a ``DPFedAvg``, has no randomizer, or whose randomizer has no
    ``center``/``radius`` (and none were given) is warned about once and the attack steps aside
    (``disabled_reason``); the training goes on.

    Attributes: ``history`` (one dict per logged round), ``last`` (``{mode:``
    :class:`~audit_callbacks.attacks.InferencePrediction` ``}`` of the last prediction).

    Resume: the checkpoint keeps ``history`` only. The attack's target is the mean of the real
    clients' un-randomized (projected) updates, which no artifact may hold, so a resumed fit
    restarts the attack and its target together at the resume (each record's ``rows`` counts
    the rows since then).
    """

    def __init__(
        self,
        *,
        center: float | None = None,
        radius: float | None = None,
        modes: Sequence[str] = INFERENCE_MODES,
        weights: Sequence[int] | None = None,
        every_n_rounds: int = 1,
        seed: int = 0,
        summary_filename: str = "ldp_inference_summary.json",
    ) -> None:
        if isinstance(modes, str):
            modes = (modes,)
        modes = tuple(modes)
        if not modes or any(m not in INFERENCE_MODES for m in modes) or len(set(modes)) != len(modes):
            raise ValueError(f"modes must be distinct names from {INFERENCE_MODES}, got {modes!r}")
        self.center = None if center is None else check_real(center, "center")
        self.radius = None if radius is None else check_positive(radius, "radius")
        self.modes = modes
        if weights is not None:
            given = np.asarray(weights).reshape(-1)
            if given.size == 0 or given.dtype == bool or not np.issubdtype(given.dtype, np.integer) \
                    or given.min() < 0:
                raise ValueError(f"weights must be non-empty, non-negative integer indices, got {weights!r}")
        self.weights = None if weights is None else np.asarray(weights, dtype=np.int64).reshape(-1)
        self.every_n_rounds = check_count(every_n_rounds, "every_n_rounds", minimum=1)
        self.seed = check_seed(seed, "seed")

        self.attacks: dict[str, LDPFLInferenceAttack] = {}
        self.history: list[dict[str, Any]] = []
        self.last: dict[str, Any] = {}
        self.summary_path: str | None = None
        #: the audit's output path: the summary, the report section, the scalars and layout
        self.output = LightningOutput("LDPInferenceAudit", summary_filename,
                                  section=self._section)
        #: why the attack stepped aside in the last fit (``not_dp_fedavg``, ``no_randomizer``,
        #: ``no_domain``), else None
        self.disabled_reason: str | None = None
        self._target_sum: np.ndarray | None = None
        self._target_count = 0
        self._pending_state: dict[str, Any] | None = None
        self._layout_written = False

    summary_filename = output_summary_filename

    @property
    def state_key(self) -> str:
        return self._generate_state_key(seed=self.seed, modes=self.modes)

    # ------------------------------------------------------------------ set-up
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.disabled_reason = None
        if not isinstance(pl_module, DPFedAvgMixin):
            return self._disable("not_dp_fedavg", (
                "LDPInferenceAudit attacks the randomized updates of DP-FedAvg: fit an "
                f"audit_callbacks.federated.DPFedAvg module (got {type(pl_module).__name__})"))
        rnd = pl_module.randomizer
        if rnd is None:
            return self._disable("no_randomizer", (
                "LDPInferenceAudit needs a local randomizer: build DPFedAvg(..., randomizer=...) "
                "with e.g. audit_callbacks.mechanisms.TwoPoint(epsilon, center, radius)"))
        c = self.center if self.center is not None else getattr(rnd, "center", None)
        r = self.radius if self.radius is not None else getattr(rnd, "radius", None)
        if c is None or r is None:
            return self._disable("no_domain", (
                f"LDPInferenceAudit needs the domain [c - r, c + r] of the randomizer; "
                f"{type(rnd).__name__} has no center/radius (the attack applies to per-coordinate "
                "mechanisms such as TwoPoint, Staircase, GRR): pass center= and radius="))
        d = int(pl_module.num_parameters)
        if self.weights is not None and int(self.weights.max()) >= d:
            raise ValueError(f"weights index {int(self.weights.max())} >= d = {d}")
        self._c, self._r = float(c), float(r)
        if not self.attacks:
            for i, mode in enumerate(self.modes):
                self.attacks[mode] = LDPFLInferenceAttack(self._c, self._r, seed=self.seed + i)
        if self._pending_state is not None:
            self._restore(self._pending_state)
            self._pending_state = None

    def _disable(self, reason: str, message: str) -> None:
        """A training this attack cannot run on: warn once and step aside for this fit (nothing
        logged, no summary); training goes on."""
        self.disabled_reason = reason
        self.output.warn(reason, f"LDPInferenceAudit disabled ({reason}): {message}; training "
                         "continues without this audit")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.disabled_reason is not None:
            return
        self.output.bind(trainer)
        if not self._layout_written:
            self.output.layout(names.chart_layout(
                [FAMILY], only=[names.tag(FAMILY, names.qualified(k, m)) for m in self.modes for k in _KEYS]))
            self._layout_written = True

    # ------------------------------------------------------------------ protocol hooks
    def _select(self, rows: torch.Tensor) -> np.ndarray:
        arr = rows.detach().to("cpu", torch.float64).numpy()
        return arr if self.weights is None else arr[:, self.weights]

    def on_federated_randomized_updates(
        self, trainer: pl.Trainer, pl_module: Any, fl_round: FederatedRound,
    ) -> None:
        """Observe the round's released rows; the attack's target is what the mechanism saw
        (``project``) of each clipped update ``fl_round.updates``."""
        if self.disabled_reason is not None:
            return
        rnd, updates, released = fl_round.randomizer, fl_round.updates, fl_round.released
        seen = rnd.project(updates) if callable(getattr(rnd, "project", None)) else updates.clamp(
            self._c - self._r, self._c + self._r)
        arr = self._select(seen)
        self._target_sum = arr.sum(0) if self._target_sum is None else self._target_sum + arr.sum(0)
        self._target_count += int(arr.shape[0])
        for mode, attack in self.attacks.items():
            values = rnd.debias(released) if mode == "debiased" else released
            attack.observe(self._select(values))
        if fl_round.index % self.every_n_rounds == 0:
            self._predict_and_log(trainer, fl_round.index)

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        """The summary now, before Lightning's teardown can lose it (a SIGTERM after it
        restored the default handler); ``on_fit_end`` refreshes it."""
        if self.disabled_reason is not None:
            return
        self.output.bind(trainer).end_training(lambda: self.on_fit_end(trainer, pl_module))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """SIGTERM / SIGINT: the summary of what was measured (``run_status``: ``interrupted at
        step N``), and an exit code that is not 0 (:mod:`audit_callbacks.callbacks.interrupt`)."""
        if self.disabled_reason is not None:
            return
        self.output.on_exception(trainer, exception,
                                 lambda status: self.on_fit_end(trainer, pl_module, status=status))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, status: str = "complete") -> None:
        if self.disabled_reason is not None:
            return
        self.output.bind(trainer)
        if not self.attacks:
            self.output.done(status)
            return
        rounds = next(iter(self.attacks.values())).rounds
        if rounds and (not self.history or self.history[-1]["round"] != int(pl_module.round)):
            self._predict_and_log(trainer, int(pl_module.round))
        path = self.output.finish(self.summary(pl_module, status), status)
        if path is not None:
            self.summary_path = path

    def summary(self, pl_module: Any, status: str = "complete") -> dict[str, Any]:
        """The summary JSON's content (the one schema: :mod:`audit_callbacks.auditing.output`;
        ``final`` and ``history`` kept beside ``inputs`` and ``results``)."""
        final = self.history[-1] if self.history else None
        results = {
            name: result_entry((final or {}).get(name),
                               reason="no round observed" if final is None else "not computed",
                               method=f"ldp_fl_inference_{mode}", source=SOURCE,
                               counts={"rows": int(final["rows"])} if final else {})
            for mode in self.modes for key in _KEYS for name in (names.qualified(key, mode),)}
        return summary_document(
            "LDPInferenceAudit", run_status=status, source=SOURCE,
            status="ok" if final is not None else "not attacked: no round observed",
            inputs={
                "randomizer": repr(pl_module.randomizer),
                "center": self._c, "radius": self._r, "modes": list(self.modes),
                "weights": None if self.weights is None else int(self.weights.size),
                "dim": int(pl_module.num_parameters), "seed": self.seed,
                "rounds": int(pl_module.round),
            },
            results=results,
            target="mean over all released rows of randomizer.project(clipped update)",
            tags={q.name: q.tag for q in names.family(FAMILY)
                  if any(q.name.endswith(f"_{m}") for m in self.modes)},
            final=final, history=self.history)

    def _section(self) -> ReportSection:
        return ReportSection(*self.report_section())

    def report_section(self) -> tuple[str, dict[str, Any]]:
        """This audit's results for the audit report: the last round's errors and confidences."""
        final = self.history[-1] if self.history else {}
        return ("local-DP inference attack (Varun et al. 2024)", {
            "status": "ok" if final else "not attacked: no round observed",
            **{k: v for k, v in final.items()}, "source": SOURCE})

    # ------------------------------------------------------------------ prediction
    def target(self) -> np.ndarray:
        """The mean projected input ``[len(weights)]`` over every row observed so far."""
        if self._target_sum is None or self._target_count == 0:
            raise RuntimeError("no round observed yet")
        return self._target_sum / self._target_count

    def _predict_and_log(self, trainer: pl.Trainer | None, round_idx: int) -> dict[str, Any]:
        target = self.target()
        rec: dict[str, Any] = {"round": round_idx}
        metrics: dict[str, float | None] = {}
        for mode, attack in self.attacks.items():
            pred = attack.predict(target=target)
            self.last[mode] = pred
            err = pred.error
            rec[names.qualified(names.ERROR_STEM, mode)] = float(np.mean(err))
            rec[names.qualified(names.ERROR_MEDIAN_STEM, mode)] = float(np.median(err))
            rec[names.qualified(names.ERROR_MAX_STEM, mode)] = float(np.max(err))
            rec[names.qualified(names.CONFIDENCE_STEM, mode)] = (
                None if pred.confidence is None else float(np.mean(pred.confidence))
            )
            for key in _KEYS:
                name = names.qualified(key, mode)
                metrics[names.tag(FAMILY, name)] = rec[name]
        rec["rows"] = self._target_count
        self.history.append(rec)
        if trainer is not None:
            self.output.bind(trainer)
            self.output.scalars(metrics, round_idx)
        return rec

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The logged records only: the target (a sum of real clients' un-randomized updates)
        stays in memory, and the attack restarts with it at a resume."""
        if not self.attacks:
            return {}
        return {"history": [dict(h) for h in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self.attacks:
            self._restore(state_dict)
        else:  # loaded before setup built the attacks
            self._pending_state = state_dict

    def _restore(self, state: dict[str, Any]) -> None:
        # an older checkpoint's "attacks" / "target_sum" are not read: the attack restarts
        self.history = [dict(h) for h in state["history"]]

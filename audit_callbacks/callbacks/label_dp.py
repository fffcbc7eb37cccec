"""Label-DP lower bounds of each Opacus DP-SGD step, as a Lightning callback.

Binary models: Yuan, Xue, Wang & Shen (2022), "Deep Gradient Attacks with Strong DP-SGD Lower
Bounds for Label Privacy", §3 eq. (3) and Alg. 2 (the sign test of the last-layer attack), with
the stronger tests on the same observation and the extrapolation of App. A.3.1. Softmax models
(K classes): the argmin attack and its integral (docs/methods/label_dp_multiclass.md).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import nn

from audit_callbacks import names
from audit_callbacks.attacks.label_gradients import (
    ReluMlpLabelNorms,
    ghost_grad_norms,
    ghost_layers,
    gradient_scale,
)
from audit_callbacks.attacks.label_reconstruction import factorize_layer
from audit_callbacks.auditing.output import result_entry, summary_document
from audit_callbacks.backends.opacus.accounting import accountant_epsilon
from audit_callbacks.backends.opacus.optimizer import find_accountant
from audit_callbacks.callbacks.label_base import CannotAudit, StepAuditCallback, linear_layers
from audit_callbacks.callbacks.label_step import LabelStepObserver
from audit_callbacks.estimators.gaussian import gaussian_epsilon
from audit_callbacks.estimators.label_dp import extrapolation_factor, label_dp_lower_bound
from audit_callbacks.validation import check_count, check_delta, check_flag, check_optional_count

__all__ = ["LabelDPLowerBound", "second_last_layer_features"]

SOURCE = ("Yuan, Xue, Wang & Shen (2022), Deep Gradient Attacks with Strong DP-SGD Lower Bounds for Label "
          "Privacy, §3 eq. (3), Alg. 2, App. A.3.1; K classes: docs/methods/label_dp_multiclass.md")


def second_last_layer_features(
    inputs: torch.Tensor, preactivations: torch.Tensor, last_weight: torch.Tensor, unit: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example dZ_r/dW for the weights (and bias) into hidden unit J of the last hidden layer.

    dZ_r/dW_J = W^L_J U_r [x_r^{L-1}, 1] with U_r = ReLU'(Z^L_J[r]) (Yuan et al. 2022, App.
    A.1.2, Alg. 4). Rows with U_r = 0 carry no information on the label and are dropped.

    Args:
        inputs: [N, p'] inputs of the second-last linear layer, x^{L-1}.
        preactivations: [N, H] its outputs Z^L (before the ReLU).
        last_weight: [1, H] weight of the last (logit) layer.
        unit: J in [0, H).

    Returns:
        ``(features [n_det, p' + 1], determined [N] bool)``: the effective features of the
        determined examples, to pass to ``label_dp_lower_bound`` with ``bias=False``.
    """
    active = preactivations[:, unit] > 0
    w = float(last_weight.reshape(-1)[unit])
    ones = torch.ones(inputs.shape[0], 1, dtype=inputs.dtype, device=inputs.device)
    feats = w * torch.cat([inputs, ones], dim=1)
    return feats[active], active


class LabelDPLowerBound(StepAuditCallback):
    """Label-DP lower bounds of each DP-SGD step against the last-layer label attack.

    For a model whose last layer is ``nn.Linear`` -- one sigmoid logit (binary, log-loss) or K
    softmax outputs (cross-entropy) -- on the steps the Trainer logs (or every ``every_n_steps``
    logical steps) it computes, from
    the batch's last-hidden activations, the model's probabilities, the labels and Opacus'
    per-example gradient norms (over all parameters, before clipping; from the per-example
    bias gradients and input norms when every trained parameter is in an ``nn.Linear`` with a
    bias, else from ``grad_sample``),
    :func:`~audit_callbacks.estimators.label_dp.label_dp_lower_bound` and logs, in nats at
    ``delta``, on the Trainer's ``log_every_n_steps`` steps (``records`` and the summary keep
    every attacked step, keyed by the same names; the family ``label_dp`` of
    :mod:`audit_callbacks.names`):

    * ``label_dp/epsilon_lower_bound`` - the bound of this batch (binary: the sign test of Yuan
      et al. 2022 Alg. 2; K classes: the argmin test, docs/methods/label_dp_multiclass.md eq. (5));
    * ``label_dp/epsilon_lower_bound_max`` - its running maximum over the attacked steps;
    * ``label_dp/epsilon_lower_bound_extrapolated`` - the mean batch bound times
      ``1 + log M / log N`` (Yuan et al. 2022 App. A.3.1; M attacked steps, N the expected batch
      size);
    * ``label_dp/epsilon_pair_optimal_test``, ``label_dp/epsilon_pair_layer``,
      ``label_dp/epsilon_pair_all_params`` - Gaussian-pair epsilons of the same observation
      (Balle & Wang 2018, Thm. 8), each >= the one before (max over examples);
    * ``label_dp/epsilon_lower_bound_second_last`` (and its running ``..._max``) - binary only,
      with ``second_last=True``: the bound from the second-last layer (Yuan et al. 2022 Alg. 4);
    * ``label_dp/epsilon_single_step`` - the upper bound of one step for replacing one label, the
      Gaussian mechanism with sensitivity 2C (mu = 2 / sigma, no amplification);
    * ``label_dp/epsilon_accountant`` - the run's Opacus accountant (amplified, composed),
      logged at each training epoch end;
    * ``label_dp/expected_attack_accuracy`` - mean over the attacked examples of P0[r], the
      probability that the last-layer attack recovers label r at this noise (what
      ``LabelReconstructionAttack``'s accuracy averages to; K classes: P0 on logged steps only,
      see ``max_pairs``), a running mean published only when another ``min_examples`` examples
      were attacked, as ``LabelReconstructionAttack``'s accuracy: one batch's mean P0 is a label
      oracle (an adversary who knows the batch's features recomputes it for every candidate
      label vector), so it is kept per step only in memory (:attr:`p0_history`), never logged,
      summarized or checkpointed;
    * ``label_dp/attacked_fraction``, ``label_dp/skip_reason`` - coverage (see
      :mod:`audit_callbacks.callbacks.label_base`).

    K classes: the clip factor of a replaced label needs the whole gradient's norm at that label;
    for an MLP of biased ``nn.Linear`` layers with ReLU it is computed exactly
    (:class:`~audit_callbacks.attacks.label_gradients.ReluMlpLabelNorms`), otherwise the
    conservative form of the estimator is used (``flipped_norms`` in the summary says which).

    Threat model: one release of one step on a batch the adversary knows (white-box). The
    single-step bound is the analytic ceiling of every per-batch value; the accountant's
    epsilon is for the whole run under Poisson sampling and add/remove neighbours.

    Args:
        every_n_steps: None (default): compute on the steps the Trainer logs
            (``log_every_n_steps``); n: on one logical step in n (1: every step). See
            :mod:`audit_callbacks.callbacks.label_base`.
        delta: delta of every epsilon (default: the module's ``delta`` or 1e-5).
        second_last: binary models: also bound the second-last layer's attack (ReLU MLP).
        label_fn: ``batch -> labels [N]`` (default: ``batch[1]``).
        summary_filename: JSON at fit end (None: none).
        observer: a :class:`LabelStepObserver` shared with ``LabelReconstructionAttack``
            (default: the one attached to the optimizer).
        max_pairs: K classes: evaluate the integrals for the 16 (default) pairs (example,
            replacement label) ranked first by a closed-form upper bound on their bound (a
            valid lower bound, at most the exhaustive one: the tests find them equal), and P0
            of every example only on logged steps; None: every pair at every step.
        min_examples: attacked examples per published block of ``expected_attack_accuracy``
            (default 100, >= 1), as ``LabelReconstructionAttack``'s.

    Raises:
        ValueError: naming the argument: ``delta`` neither None nor in (0, 1), ``every_n_steps``
            or ``max_pairs`` neither None nor an integer >= 1, ``min_examples`` not an integer
            >= 1, ``second_last`` not a bool,
            ``label_fn`` neither None nor callable, ``observer`` not a ``LabelStepObserver``;
            on resume, a checkpoint whose bounds were computed at another ``delta`` (as
            resolved: given or the module's), ``every_n_steps``, ``second_last`` or
            ``min_examples`` (naming the setting and both values; a checkpoint saved before the
            settings were kept loads as before).
    The last layer is the ``nn.Linear`` whose output is the model's output (found on the first
    step, whatever the order the layers were registered in; the second-last is the
    ``nn.Linear`` called before it): see :mod:`audit_callbacks.callbacks.label_base`. Under
    ``bf16-mixed``, ``bf16-true`` and ``16-mixed`` the loss check allows for the gradients'
    rounding (:func:`~audit_callbacks.attacks.label_gradients.gradient_scale`).

    Never aborts the fit: on a model it cannot audit (no ``nn.Linear`` whose output is the
    logits, no Opacus optimizer, noise multiplier 0, a loss other than log-loss / cross-entropy
    on that layer) it warns once, logs why (text in TensorBoard) and disables itself, logging
    no number afterwards (a summary with no attacked step holds none, the single-step and
    accountant references included; ``disabled_reason`` says why); a step it cannot audit
    (batch wider than the layer, rank-deficient features) is skipped with a reason code.
    """

    name = "label-DP lower bound"
    family = "label_dp"

    def __init__(
        self, *, every_n_steps: int | None = None, delta: float | None = None, second_last: bool = False,
        label_fn: Any = None, summary_filename: str | None = "label_dp_summary.json",
        observer: LabelStepObserver | None = None, max_pairs: int | None = 16, min_examples: int = 100,
    ) -> None:
        super().__init__(every_n_steps=every_n_steps, label_fn=label_fn, summary_filename=summary_filename,
                         observer=observer)
        self.max_pairs = check_optional_count(max_pairs, "max_pairs", minimum=1)
        self.min_examples = check_count(min_examples, "min_examples", minimum=1)
        self.delta = None if delta is None else check_delta(delta)
        self.second_last = check_flag(second_last, "second_last")
        self._second_last_setting = self.second_last  # as given (second_last: as used)
        self._delta_used = 1e-5
        self._fit_delta: float | None = None  # the delta resolved by this fit's on_fit_start
        self._checkpoint_delta: float | None = None  # the delta of a loaded checkpoint's bounds
        self._accountant: Any = None
        # the accountant's history as last seen: put back in front of a new accountant's (a
        # resumed or repeated fit's PrivacyEngine starts empty), as CanaryAudit does
        self._history: list[tuple[float, float, int]] = []
        self._ghost: dict[str, nn.Linear] = {}
        self._last: nn.Linear | None = None
        self.num_classes = 1
        self.flipped_norms: str | None = None
        self.records: list[dict[str, float]] = []
        self.running_max = 0.0
        self.running_max_second_last = 0.0
        self._sum = 0.0
        self.epsilon_accountant: float | None = None
        #: (step, the batch's mean P0, batch size) of every step P0 was computed on: in memory
        #: only (a label oracle), never logged, summarized or checkpointed
        self.p0_history: list[tuple[int, float, int]] = []
        # sums of P0 over the attacked examples, and those published (a block of min_examples)
        self._p0_totals = {"sum": 0.0, "attacked": 0}
        self._p0_published = {"sum": 0.0, "attacked": 0}

    def _layers(self, pl_module: pl.LightningModule) -> dict[str, nn.Linear]:
        if not linear_layers(pl_module):
            raise CannotAudit("unsupported_model", "the model has no nn.Linear layer; the bounds need a linear "
                              "last layer with one sigmoid logit or K softmax outputs")
        self._last = None
        self._find_head = True  # the nn.Linear whose output is the model's output, on the first step
        return {}

    def _bind_head(self, head: nn.Linear, previous: nn.Linear | None, order: list[nn.Linear]) -> dict[str, nn.Linear]:
        self._last = head
        self.num_classes = int(head.out_features)
        self.second_last = self._second_last_setting
        out = {"last": head}
        if self.second_last and self.num_classes > 1:
            self._warn_once("sl", "LabelDPLowerBound: second_last is for binary models only; ignored")
            self.second_last = False
        if self.second_last:
            if previous is None:
                self._warn_once("sl", "LabelDPLowerBound: no second-last linear layer; second_last ignored")
                self.second_last = False
            else:
                out["second_last"] = previous
        # the ghost layers in the order they run (the back-propagation of ReluMlpLabelNorms)
        position = {id(m): i for i, m in enumerate(order)}
        self._ghost = dict(sorted(self._ghost.items(), key=lambda kv: position.get(id(kv[1]), len(order))))
        return out

    def _check_optimizer(self) -> None:
        if float(self.optimizer.noise_multiplier) <= 0:
            raise CannotAudit("no_noise", "noise_multiplier is 0, so no step is private (every bound is inf)")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        own = getattr(pl_module, "delta", None)
        delta = self.delta if self.delta is not None else (float(own) if own else 1e-5)
        self._check_delta(delta)
        self._delta_used = self._fit_delta = delta
        super().on_fit_start(trainer, pl_module)
        if self.disabled_reason is not None:
            return
        self._accountant, _ = find_accountant(self.optimizer)
        self._carry_history()
        drawn = [q.tag for q in names.family(self.family) if self.second_last or "second_last" not in q.name]
        self.output.layout(names.chart_layout(
            [self.family], only=drawn,
            extra={names.SECTIONS[self.family]: {"model accuracy": [r"^val.*acc.*$"]}}))

    def _check_delta(self, delta: float | None) -> None:
        """Refuse a delta other than the one a loaded checkpoint's bounds were computed at
        (``delta`` given, or resolved from the module's ``delta``; None: not known yet)."""
        if delta is not None and self._checkpoint_delta is not None and delta != self._checkpoint_delta:
            self._refuse("delta", self._checkpoint_delta, delta)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self._fit_delta = None

    def _settings(self) -> dict[str, Any]:
        """The settings a resume must keep, as given (``delta`` is compared as resolved, in
        :meth:`_check_delta`)."""
        return {**super()._settings(), "second_last": self._second_last_setting, "min_examples": self.min_examples}

    def _norm_layers(self, pl_module: pl.LightningModule) -> dict[str, nn.Linear]:
        self._ghost = ghost_layers(pl_module, self.optimizer.params)
        return self._ghost

    def _norms(self, optimizer: Any, data: dict[str, Any]) -> np.ndarray:
        assert self.observer is not None
        sq = data["norm_inputs"]
        if self._ghost and sq is not None:
            by_id = self.observer.grad_samples_by_param(optimizer)
            norms = ghost_grad_norms([by_id[id(m.bias)] for m in self._ghost.values()],
                                     [torch.linalg.vector_norm(sq[k], dim=1).to("cpu", torch.float64) ** 2
                                      for k in self._ghost])
            if norms is not None:
                return norms
        return self.observer.grad_norms(optimizer)

    def _on_step(self, optimizer: Any, data: dict[str, Any]) -> dict[str, float] | None:
        assert self._last is not None and self.observer is not None
        x = data["inputs"]["last"]
        n, p = x.shape
        bias = self._last.bias is not None
        if n > p + bias:
            self._skip("batch_wider_than_layer", f"a batch of {n} examples is larger than the last layer's {p} "
                       f"inputs{' (+1 bias)' if bias else ''} allow (use a smaller batch or a wider layer)")
            return None
        z = data["outputs"]["last"]
        y = data["labels"].numpy().astype(np.int64)
        if self.num_classes == 1:
            probs = torch.sigmoid(z[:, 0]).clamp(1e-12, 1 - 1e-12).numpy()
            err = probs - y
        else:
            probs = torch.softmax(z, dim=1).numpy()
            if y.min() < 0 or y.max() >= self.num_classes:
                self._disable("unsupported_loss", f"labels outside 0..{self.num_classes - 1}")
                self.skips["unsupported_loss"] += 1
                return None
            err = probs - np.eye(self.num_classes)[y]
        by_id = self.observer.grad_samples_by_param(optimizer)
        kappa = gradient_scale(err, by_id.get(id(self._last.bias)) if bias else None,
                               weight_grads=by_id.get(id(self._last.weight)), features=x)
        if kappa is None:
            self._disable("unsupported_loss", "the last layer's per-example gradients are not kappa (p - e_y) [x, 1] "
                          "with one kappa > 0 for the batch; the bounds need log-loss on one sigmoid logit "
                          "(BCEWithLogitsLoss) or cross-entropy on softmax outputs")
            self.skips["unsupported_loss"] += 1
            return None
        norms = self._norms(optimizer, data)
        flipped = self._flipped_norms(data, probs, y, kappa, by_id)
        kw = dict(max_grad_norm=float(optimizer.max_grad_norm), noise_multiplier=float(optimizer.noise_multiplier),
                  expected_batch_size=float(optimizer.expected_batch_size), delta=self._delta_used,
                  grad_scale=kappa)
        try:
            v = self.observer.factorization(optimizer, self._last, x, bias).gram_inv_diag
            res = label_dp_lower_bound(x.numpy(), probs, y, norms, bias=bias, gram_inv_diag=v.numpy(),
                                       flipped_grad_norms=flipped, max_pairs=self.max_pairs,
                                       p0_for_all=self._log_this_batch, **kw)
        except ValueError as err:
            self._skip("rank_deficient", str(err))
            return None
        lb = res.epsilon_lower_bound.value
        self.running_max = max(self.running_max, lb)
        self._sum += lb
        attacked = len(self.records) + 1
        n_e = max(2, int(round(float(optimizer.expected_batch_size))))
        # the step's results by name but P0's mean (a label oracle: summed, published by blocks
        # of min_examples), then the run's running values
        results = res.results()
        p0 = results.pop(names.EXPECTED_ATTACK_ACCURACY, None)
        if p0 is not None:
            self.p0_history.append((self.steps, float(p0.value), n))
            t = self._p0_totals
            t["sum"] += float(p0.value) * n
            t["attacked"] += n
            if t["attacked"] - self._p0_published["attacked"] >= self.min_examples:
                self._p0_published = dict(t)
        record = {"step": float(self.steps), **{k: r.value for k, r in results.items()},
                  names.EPSILON_LOWER_BOUND_MAX: self.running_max,
                  names.EPSILON_LOWER_BOUND_EXTRAPOLATED:
                      self._sum / attacked * extrapolation_factor(attacked, n_e)}
        if self.second_last:
            sl = self._second_last(data, probs, y, norms, kw)
            if sl is not None:
                self.running_max_second_last = max(self.running_max_second_last, sl)
                record[names.EPSILON_LOWER_BOUND_SECOND_LAST] = sl
            record[names.EPSILON_LOWER_BOUND_SECOND_LAST_MAX] = self.running_max_second_last
        self.records.append(record)
        out = {k: v for k, v in record.items() if k != "step"}
        if self.published_expected_attack_accuracy is not None:
            out[names.EXPECTED_ATTACK_ACCURACY] = self.published_expected_attack_accuracy
        return out

    @property
    def published_expected_attack_accuracy(self) -> float | None:
        """Mean P0 over every attacked example up to the latest complete block of
        ``min_examples`` (None before the first): what the logger and the summary get."""
        p = self._p0_published
        return p["sum"] / p["attacked"] if p["attacked"] else None

    def _flipped_norms(self, data: dict[str, Any], probs: np.ndarray, y: np.ndarray, kappa: float,
                       by_id: dict[int, torch.Tensor]) -> Any:
        """K classes, ReLU MLP: ``(rows, labels) -> norms`` of the whole gradient at those labels
        (checked once per step against Opacus' bias gradients at the observed labels), else None."""
        if self.num_classes == 1:
            return None
        sq = data["norm_inputs"]
        fn = None
        if self._ghost and sq is not None:
            layers = list(self._ghost.values())
            prep = ReluMlpLabelNorms([m.weight for m in layers], [sq[k] for k in self._ghost], torch.as_tensor(probs),
                                     torch.as_tensor(y), kappa, dtype=torch.float32)
            if prep.ok and prep.matches([by_id[id(m.bias)] for m in layers]):
                def fn(rows: np.ndarray, labels: np.ndarray) -> np.ndarray:
                    return prep(rows, labels).numpy()
        self.flipped_norms = "exact (ReLU MLP back-propagation)" if fn is not None else \
            "unknown: P1 maximised over the clip factor (conservative)"
        return fn

    def _second_last(self, data: dict[str, Any], probs, y, norms, kw) -> float | None:
        assert self._last is not None
        z = data["outputs"]["second_last"]
        unit = int((z > 0).sum(0).argmax())
        feats, active = second_last_layer_features(data["inputs"]["second_last"], z,
                                                   self._last.weight.detach().cpu(), unit)
        if feats.shape[0] < 1 or feats.shape[0] > feats.shape[1]:
            return None
        mask = active.numpy()
        try:
            v = factorize_layer(feats, bias=False).gram_inv_diag.numpy()
            res = label_dp_lower_bound(feats.numpy(), probs[mask], y[mask], norms[mask], bias=False,
                                       gram_inv_diag=v, **kw)
        except ValueError:
            return None
        return res.epsilon_lower_bound.value

    def _carry_history(self) -> None:
        """Put the history of the steps before this fit (a checkpoint's, or the previous fit's)
        in front of the accountant's own, once, so that ``epsilon_accountant`` (and Opacus' own
        ``get_epsilon``) covers the whole training; an accountant that holds it already (the
        same one, or one CanaryAudit restored first) is left as it is."""
        acc, old = self._accountant, self._history
        if acc is None or not old:
            return
        current = [tuple(h) for h in acc.history]
        if current[: len(old)] == old:
            return
        acc.history = [*old, *current]
        self._warn_once("history", f"{type(self).__name__}: a new Opacus accountant (resumed or repeated "
                         f"fit): {sum(h[2] for h in old)} earlier steps were put back into its history, "
                         "so its epsilon covers the whole training")

    def _seen_history(self) -> list[tuple[float, float, int]]:
        """The accountant's history now (the one carried otherwise)."""
        if self._accountant is not None:
            self._history = [tuple(h) for h in self._accountant.history]
        return self._history

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.disabled_reason is not None or self._accountant is None:
            return  # a disabled callback logs nothing (docs/outputs.md)
        self._seen_history()
        self.epsilon_accountant = accountant_epsilon(self._accountant, self._delta_used)
        if self.epsilon_accountant is not None:
            pl_module.log(names.tag(self.family, names.EPSILON_ACCOUNTANT), self.epsilon_accountant,
                          on_step=False, on_epoch=True)

    @property
    def epsilon_single_step(self) -> float | None:
        """The single-step upper bound at the optimizer's noise multiplier (None without noise)."""
        if self.optimizer is None or float(self.optimizer.noise_multiplier) <= 0:
            return None
        return float(gaussian_epsilon(float(self.optimizer.noise_multiplier), self._delta_used, sensitivity=2.0))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, status: str = "complete") -> None:
        self._finish(trainer, self.summary(status), status)

    def summary(self, status: str = "complete") -> dict[str, Any]:
        """The summary JSON's content (the one schema: :mod:`audit_callbacks.auditing.output`;
        the keys of before kept beside ``inputs`` and ``results``)."""
        self._seen_history()  # a repeated fit carries it
        last = self.records[-1] if self.records else {}
        opt = self.optimizer
        attacked = bool(self.attacked_steps)
        not_attacked = "no step could be attacked (see skips)"
        if self.disabled_reason is not None:
            not_attacked = f"disabled ({self.disabled_reason}) before any step was attacked"
        # disabled before any attacked step: no number at all, the references included (they
        # would read as this audit's results); disabled later: what was measured until then
        silent = self.disabled_reason is not None and not attacked
        inputs = {
            "num_classes": self.num_classes, "delta": self._delta_used,
            "noise_multiplier": float(opt.noise_multiplier) if opt is not None else None,
            "max_grad_norm": float(opt.max_grad_norm) if opt is not None else None,
            "expected_batch_size": opt.expected_batch_size if opt is not None else None,
            "every_n_steps": self.every_n_steps, "second_last": self.second_last,
            "min_examples": self.min_examples,
        }
        values = {
            # no step attacked: "not attacked", never a bound of 0.0 that reads as a measurement
            names.EPSILON_LOWER_BOUND_MAX: self.running_max if attacked else None,
            names.EPSILON_LOWER_BOUND_SECOND_LAST_MAX: (self.running_max_second_last
                                                        if self.second_last and attacked else None),
            names.EPSILON_LOWER_BOUND_EXTRAPOLATED: last.get(names.EPSILON_LOWER_BOUND_EXTRAPOLATED),
            names.EPSILON_SINGLE_STEP: None if silent else self.epsilon_single_step,
            names.EPSILON_ACCOUNTANT: None if silent else accountant_epsilon(self._accountant, self._delta_used),
            names.EXPECTED_ATTACK_ACCURACY: self.published_expected_attack_accuracy,
        }
        method = {names.EPSILON_LOWER_BOUND_MAX: "max over attacked steps of the last-layer label attack",
                  names.EPSILON_LOWER_BOUND_SECOND_LAST_MAX: "max over attacked steps, second-last layer",
                  names.EPSILON_LOWER_BOUND_EXTRAPOLATED: "mean batch bound x (1 + log M / log N)",
                  names.EPSILON_SINGLE_STEP: "gaussian mechanism, sensitivity 2C",
                  names.EPSILON_ACCOUNTANT: "opacus accountant",
                  names.EXPECTED_ATTACK_ACCURACY: "mean P0 over the attacked examples, published by blocks of "
                                                  "min_examples"}
        results = {
            name: result_entry(value, delta=self._delta_used, method=method[name], source=SOURCE,
                               counts={"attacked_steps": self.attacked_steps,
                                       **({"n": int(self._p0_published["attacked"])}
                                          if name == names.EXPECTED_ATTACK_ACCURACY else {})},
                               reason=not_attacked if silent or name.startswith(names.EPSILON_LOWER_BOUND)
                               else (f"fewer than min_examples = {self.min_examples} examples with P0"
                                     if name == names.EXPECTED_ATTACK_ACCURACY else "unknown"))
            for name, value in values.items()}
        return summary_document(
            "LabelDPLowerBound", run_status=status, source=SOURCE,
            status="ok" if attacked else f"not attacked: {not_attacked}",
            inputs=inputs, results=results,
            threat_model="one release of one DP-SGD step on a known batch; the adversary runs the "
                         "last-layer (and second-last-layer) label attack",
            num_classes=self.num_classes, flipped_norms=self.flipped_norms, delta=self._delta_used,
            noise_multiplier=inputs["noise_multiplier"], max_grad_norm=inputs["max_grad_norm"],
            expected_batch_size=inputs["expected_batch_size"], **self.coverage(), **values,
            records=self.records)

    def report_section(self) -> tuple[str, dict[str, Any]]:
        """This audit's results for the audit report (written once every audit of the run
        finished)."""
        last = self.records[-1] if self.records else {}
        return ("label-DP lower bound (Yuan, Xue, Wang, Shen 2022)", {
            "status": "ok" if self.attacked_steps else "not attacked: no step could be attacked",
            names.EPSILON_LOWER_BOUND_MAX: self.running_max if self.attacked_steps else None,
            names.EPSILON_LOWER_BOUND_EXTRAPOLATED: last.get(names.EPSILON_LOWER_BOUND_EXTRAPOLATED),
            names.EPSILON_SINGLE_STEP: (None if self.disabled_reason is not None and not self.attacked_steps
                                        else self.epsilon_single_step), "attacked_steps": self.attacked_steps,
            "considered_steps": self.considered, "disabled_reason": self.disabled_reason})

    def state_dict(self) -> dict[str, Any]:
        """The records and running values, the accountant's history, the published P0 sums,
        the coverage, the settings (``delta`` as resolved) and what the summary states of the
        model (``num_classes``, ``flipped_norms``, the second-last bound as used)."""
        state = self._coverage_state()
        state["settings"] = {**state["settings"], "delta": self._delta_used}
        return {**state, "num_classes": self.num_classes, "flipped_norms": self.flipped_norms,
                "second_last_used": self.second_last, "records": [dict(r) for r in self.records],
                "running_max": self.running_max, "running_max_second_last": self.running_max_second_last,
                "sum": self._sum, "accountant_history": [list(h) for h in self._seen_history()],
                # P0 only as published (a sum one step ahead of the last one's is a label oracle);
                # a resume drops the examples since the last block
                "p0_published": dict(self._p0_published)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raises ValueError (naming the setting and both values) for a checkpoint computed at
        other settings; one saved before the settings were kept loads as before."""
        saved = state_dict.get("settings")
        delta = saved.get("delta") if isinstance(saved, dict) else None
        before = self._checkpoint_delta
        self._checkpoint_delta = None if delta is None else float(delta)
        try:
            # given, or resolved already (a strategy that restores after on_fit_start)
            self._check_delta(self.delta if self.delta is not None else self._fit_delta)
            self._load_coverage_state(state_dict)
        except ValueError:
            self._checkpoint_delta = before
            raise
        self.num_classes = int(state_dict.get("num_classes", self.num_classes))
        flipped = state_dict.get("flipped_norms", self.flipped_norms)
        self.flipped_norms = None if flipped is None else str(flipped)
        self.second_last = bool(state_dict.get("second_last_used", self.second_last))
        self.records = [dict(r) for r in state_dict.get("records", [])]
        self.running_max = float(state_dict.get("running_max", 0.0))
        self.running_max_second_last = float(state_dict.get("running_max_second_last", 0.0))
        self._sum = float(state_dict.get("sum", 0.0))
        self._history = [tuple(h) for h in state_dict.get("accountant_history", [])]
        saved = state_dict.get("p0_published", {})
        self._p0_published = {"sum": float(saved.get("sum", 0.0)), "attacked": int(saved.get("attacked", 0))}
        self._p0_totals = dict(self._p0_published)
        self.p0_history = []

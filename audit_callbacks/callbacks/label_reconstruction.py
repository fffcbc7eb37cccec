"""Label reconstruction from the privatized gradient of Opacus DP-SGD, as a Lightning callback.

The attack of Yuan, Xue, Wang & Shen (2022), "Deep Gradient Attacks with Strong DP-SGD Lower
Bounds for Label Privacy", §3 eq. (1), Alg. 1 and Alg. 3 (binary), extended to a softmax layer
(argmin of the solved statistic; docs/methods/label_dp_multiclass.md).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import nn
from torchmetrics.functional.classification import binary_accuracy, multiclass_accuracy

from audit_callbacks import names
from audit_callbacks.attacks.label_gradients import gradient_scale
from audit_callbacks.attacks.label_reconstruction import reconstruct_labels
from audit_callbacks.auditing.output import result_entry, summary_document
from audit_callbacks.callbacks.label_base import CannotAudit, StepAuditCallback, linear_layers
from audit_callbacks.callbacks.label_step import LabelStepObserver
from audit_callbacks.validation import check_count

__all__ = ["LabelReconstructionAttack", "recover_label_counts"]

SOURCE = ("Yuan, Xue, Wang & Shen (2022), Deep Gradient Attacks with Strong DP-SGD Lower Bounds for Label "
          "Privacy, §3 eq. (1), Alg. 1 and 3; softmax: docs/methods/label_dp_multiclass.md")


def recover_label_counts(probs: np.ndarray, clip: np.ndarray, kappa: float, bias_grad: np.ndarray,
                         expected_batch_size: float) -> np.ndarray:
    """Label counts of a batch from the privatized bias gradient of a softmax (or sigmoid) layer.

    The bias gradient is b = (1/N_e) sum_r c_r kappa (p_r - e_{y_r}) + noise (Yuan et al. 2022
    eq. (1) with the bias's dZ/db = 1), so w_k = kappa sum_r c_r p_rk - N_e b_k = kappa sum_r c_r
    [y_r = k] + noise: the clip-weighted counts. The counts are w_+ scaled to sum to N and rounded
    by largest remainders (exact without noise when the clip factors are equal, e.g. none
    clipped). Needs no full-rank system, so it works when the batch is wider than the layer.

    Args:
        probs: [N, K] softmax outputs (or [N] sigmoid outputs: K = 2, class 1 = positive).
        clip: [N] clip factors c_r (the auditor's knowledge; a white-box adversary with the batch
            features can compute them up to the label).
        kappa: the loss scale. bias_grad: [K] ([1] for a sigmoid) privatized bias gradient.
        expected_batch_size: N_e, Opacus' divisor.

    Returns:
        int64 [K] counts summing to N.
    """
    p = np.asarray(probs, dtype=float)
    b = np.asarray(bias_grad, dtype=float).reshape(-1)
    if p.ndim == 1:
        w1 = kappa * float(np.sum(clip * p)) - expected_batch_size * float(b[0])
        w = np.array([kappa * float(np.sum(clip)) - w1, w1])
    else:
        w = kappa * (clip[:, None] * p).sum(0) - expected_batch_size * b
    n = p.shape[0]
    w = np.clip(w, 0.0, None)
    if w.sum() <= 0:
        return np.zeros(w.shape[0], dtype=np.int64)
    share = n * w / w.sum()
    counts = np.floor(share).astype(np.int64)
    rest = n - int(counts.sum())
    counts[np.argsort(-(share - counts), kind="stable")[:rest]] += 1
    return counts


class LabelReconstructionAttack(StepAuditCallback):
    """Reconstruct training labels from the privatized aggregated gradient (Yuan et al. 2022).

    Threat model: an honest-but-curious party that sees the gradient DP-SGD releases at a step
    (clipped, noised, divided by the expected batch size) for one linear layer, and the inputs
    of that layer for the batch's examples (white-box model, known batch features). On the steps
    the Trainer logs (or every ``every_n_steps`` logical steps) it runs
    :func:`~audit_callbacks.attacks.label_reconstruction.reconstruct_labels` on
    ``(inputs [N, p], weight.grad [K, p], bias.grad [K])`` and compares with the true labels
    (Yuan et al. 2022 §3 eq. (1), Alg. 1 and 3; K > 1: argmin of the solved statistic).

    No label oracle in the outputs. An attacked step's accuracy against the true labels, with
    its batch size, tells an attacker how many of the attack's own guesses were right in that
    batch; combined with the guesses it recovers the labels (200/200 at z = 20, where
    the attack alone got 47.5%). So nothing per step is written anywhere: the accuracy reaches
    the logger, the summary and the checkpoint only as aggregates over blocks of at least
    ``min_examples`` attacked examples. ``label_attack/accuracy`` is the running accuracy over
    every attacked example up to the end of the latest complete block (it changes only when
    another ``min_examples`` examples have been attacked, so the difference of two logged values
    covers at least ``min_examples`` examples); ``label_attack/count_accuracy`` likewise for the
    narrow-head label counts. Both are logged with ``label_attack/attacked_fraction`` and
    ``label_attack/skip_reason`` (see :mod:`audit_callbacks.callbacks.label_base`) at the
    Trainer's ``log_every_n_steps`` steps (family ``label_attack`` of
    :mod:`audit_callbacks.names`); ``label_attack_summary.json`` (fit end) holds the same
    aggregates (``accuracy``, ``accuracy_examples``) and the skip counts, never a per-step row.
    ``history`` and ``count_history`` ((step, accuracy, batch size) per attacked step) stay in
    memory for the user's own analysis: never logged, summarized or checkpointed (a resumed
    callback starts them empty; the aggregates carry on).

    Narrow heads. When the batch is wider than the layer (N > p + 1) the per-example system is
    under-determined: the step is skipped with reason ``batch_wider_than_layer`` and, when the
    layer has a bias, the batch's label COUNTS are recovered from the bias gradient instead
    (:func:`recover_label_counts`); ``label_attack/count_accuracy`` = sum_k min(n^_k, n_k) / N
    (1 = every count right) is logged and kept in ``count_history``.

    Args:
        layer: the attacked ``nn.Linear`` (default: the ``nn.Linear`` whose output is the
            model's output, found on the first step by
            :class:`~audit_callbacks.callbacks.label_step.HeadProbe`: the last one called whose
            output is the logits, whatever the order the layers were registered in; none such:
            the callback warns once and disables itself, ``unsupported_model``).
        every_n_steps: None (default): attack the steps the Trainer logs
            (``log_every_n_steps``); n: one logical step in n (1: every step). See
            :mod:`audit_callbacks.callbacks.label_base`.
        label_fn: ``batch -> labels [N]`` (default: ``batch[1]``).
        summary_filename: JSON written at fit end in the logger's directory (None: none).
        observer: a :class:`LabelStepObserver` shared with ``LabelDPLowerBound`` (default: the
            one attached to the optimizer).
        min_examples: attacked examples per published block (default 100, >= 1); see above.

    Raises:
        ValueError: naming the argument: ``layer`` neither None nor an ``nn.Linear``,
            ``min_examples`` not an integer >= 1,
            ``every_n_steps`` neither None nor an integer >= 1, ``label_fn`` neither None nor
            callable, ``observer`` not a ``LabelStepObserver``; on resume, a checkpoint of an
            attack at another ``every_n_steps`` or ``min_examples`` (naming the setting and both
            values; a checkpoint saved before the settings were kept loads as before).

    Never aborts the fit: without an Opacus ``DPOptimizer`` or an ``nn.Linear`` layer whose
    output is the logits it warns once, records why (``disabled_reason``, the summary) and
    disables itself; a disabled callback logs no number afterwards.
    """

    name = "label reconstruction"
    family = "label_attack"

    def __init__(
        self, layer: nn.Linear | None = None, *, every_n_steps: int | None = None, label_fn: Any = None,
        summary_filename: str | None = "label_attack_summary.json", observer: LabelStepObserver | None = None,
        min_examples: int = 100,
    ) -> None:
        super().__init__(every_n_steps=every_n_steps, label_fn=label_fn, summary_filename=summary_filename,
                         observer=observer)
        if layer is not None and not isinstance(layer, nn.Linear):
            raise ValueError(f"layer must be None or an nn.Linear, got {type(layer).__name__}")
        self.layer = layer
        self._user_layer = layer
        self._num_classes = 1
        self._layer_repr = repr(layer)  # the attacked layer as the summary states it (kept by a resume)
        self.min_examples = check_count(min_examples, "min_examples", minimum=1)
        # in memory only (never logged, summarized or checkpointed): a per-step label oracle
        self.history: list[tuple[int, float, int]] = []  # (step, batch accuracy, batch size)
        self.count_history: list[tuple[int, float, int]] = []  # (step, count accuracy, batch size)
        # aggregates: totals over every attacked example, and the published (block) ones
        self._totals = {"correct": 0, "attacked": 0, "count_correct": 0, "count_attacked": 0}
        self._published = {"correct": 0, "attacked": 0, "count_correct": 0, "count_attacked": 0}

    def _layers(self, pl_module: pl.LightningModule) -> dict[str, nn.Linear]:
        if self._user_layer is not None:
            return self._bind_head(self._user_layer, None, [])
        if not linear_layers(pl_module):
            raise CannotAudit("unsupported_model", "the module has no nn.Linear layer to attack")
        self.layer = None
        self._find_head = True  # the nn.Linear whose output is the model's output, on the first step
        return {}

    def _bind_head(self, head: nn.Linear, previous: nn.Linear | None, order: list[nn.Linear]) -> dict[str, nn.Linear]:
        self.layer = head
        self._layer_repr = repr(head)
        self._num_classes = int(head.out_features)
        return {"layer": head}

    def _on_step(self, optimizer: Any, data: dict[str, Any]) -> dict[str, float] | None:
        x = data["inputs"]["layer"]
        labels = data["labels"]
        layer = self.layer
        assert layer is not None and self.observer is not None
        if layer.weight.grad is None or (layer.bias is not None and layer.bias.grad is None):
            self._skip("no_gradient", "the attacked layer has no gradient")
            return None
        w_grad = layer.weight.grad.detach().to("cpu", torch.float64)
        b_grad = None if layer.bias is None else layer.bias.grad.detach().to("cpu", torch.float64)
        if x.shape[0] > x.shape[1] + (b_grad is not None):
            self._skip("batch_wider_than_layer", f"a batch of {x.shape[0]} examples is larger than the attacked "
                       f"layer's {x.shape[1]} inputs (+1 bias) allow; the label counts are recovered from the bias "
                       "gradient instead (label_attack/count_accuracy); use a smaller batch or a wider layer for "
                       "per-example labels")
            return self._counts(optimizer, data, b_grad)
        try:
            factor = self.observer.factorization(optimizer, layer, x, b_grad is not None)
            pred = reconstruct_labels(x, w_grad, b_grad, factorization=factor)
        except ValueError as err:  # rank-deficient features, NaN/inf
            self._skip("rank_deficient", str(err))
            return None
        target = labels.to(pred.dtype)
        if self._num_classes == 1:  # torchmetrics' functional form: no metric state to sync per step
            batch_acc = float(binary_accuracy(pred, target, validate_args=False))
        else:
            batch_acc = float(multiclass_accuracy(pred, target, num_classes=self._num_classes, average="micro",
                                                  validate_args=False))
        n = int(x.shape[0])
        self.history.append((self.steps, batch_acc, n))
        self._add("", round(batch_acc * n), n)
        return self._published_values()

    def _add(self, prefix: str, correct: int, examples: int) -> None:
        """Add one attacked batch to the totals; publish when a block of ``min_examples`` is full."""
        t, p = self._totals, self._published
        t[f"{prefix}correct"] += int(correct)
        t[f"{prefix}attacked"] += int(examples)
        if t[f"{prefix}attacked"] - p[f"{prefix}attacked"] >= self.min_examples:
            p[f"{prefix}correct"], p[f"{prefix}attacked"] = t[f"{prefix}correct"], t[f"{prefix}attacked"]

    def _published_values(self) -> dict[str, float]:
        """The aggregates the logger may see: {} before the first complete block."""
        out = {}
        if self.published_accuracy is not None:
            out[names.ACCURACY] = self.published_accuracy
        if self.published_count_accuracy is not None:
            out[names.COUNT_ACCURACY] = self.published_count_accuracy
        return out

    def _counts(self, optimizer: Any, data: dict[str, Any], b_grad: torch.Tensor | None) -> None:
        """Recover the label counts (narrow head); logs through ``_latest``, returns None."""
        if b_grad is None or self.layer is None:
            return None
        z = data["outputs"]["layer"]
        y = data["labels"].to(torch.int64)
        probs = (torch.sigmoid(z[:, 0]) if self._num_classes == 1 else torch.softmax(z, dim=1)).numpy()
        k = max(2, self._num_classes)
        onehot = np.eye(k)[y.numpy()]
        err = probs - y.numpy() if self._num_classes == 1 else probs - onehot
        by_id = self.observer.grad_samples_by_param(optimizer) if self.observer is not None else {}
        kappa = gradient_scale(err, by_id.get(id(self.layer.bias)))
        if kappa is None:
            return None
        norms = self.observer.grad_norms(optimizer)
        clip = np.minimum(1.0, float(optimizer.max_grad_norm) / np.maximum(norms, 1e-300))
        counts = recover_label_counts(probs, clip, kappa, b_grad.numpy(), float(optimizer.expected_batch_size))
        true = np.bincount(y.numpy(), minlength=k)
        right = int(np.minimum(counts, true).sum())
        acc = float(right) / max(1, int(true.sum()))
        self.count_history.append((self.steps, acc, int(true.sum())))
        self._add("count_", right, int(true.sum()))
        self._latest.update(self._published_values())
        return None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        self.output.layout(names.chart_layout(
            [self.family], extra={names.SECTIONS[self.family]: {"model accuracy": [r"^val.*acc.*$"]}}))

    @property
    def accuracy(self) -> float | None:
        """Running reconstruction accuracy over every attacked example (None before any): the
        micro average, i.e. batch accuracies weighted by batch size. In memory only; the logged
        and summarized value is :attr:`published_accuracy`."""
        t = self._totals
        return t["correct"] / t["attacked"] if t["attacked"] else None

    @property
    def attacked_examples(self) -> int:
        """Examples whose labels the attack reconstructed so far (per-example path)."""
        return int(self._totals["attacked"])

    @property
    def published_accuracy(self) -> float | None:
        """Accuracy over every attacked example up to the latest complete block of
        ``min_examples`` (None before the first): what the logger and the summary get."""
        p = self._published
        return p["correct"] / p["attacked"] if p["attacked"] else None

    @property
    def published_count_accuracy(self) -> float | None:
        """Narrow heads: sum_k min(n^_k, n_k) / N over the label counts of every count-attacked
        batch up to the latest complete block (None before the first)."""
        p = self._published
        return p["count_correct"] / p["count_attacked"] if p["count_attacked"] else None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, status: str = "complete") -> None:
        self._finish(trainer, self.summary(status), status)

    def summary(self, status: str = "complete") -> dict[str, Any]:
        """The summary JSON's content (the one schema: :mod:`audit_callbacks.auditing.output`;
        the keys of before kept beside ``inputs`` and ``results``)."""
        why = self._status()
        reason = why if why != "ok" else "not computed"
        results = {
            names.ACCURACY: result_entry(self.published_accuracy, reason=reason, method="last-layer label attack",
                                     source=SOURCE, counts={"n": int(self._published["attacked"])}),
            names.COUNT_ACCURACY: result_entry(self.published_count_accuracy, reason="no label counts attacked",
                                           method="label-count attack", source=SOURCE,
                                           counts={"n": int(self._published["count_attacked"])}),
        }
        return summary_document(
            "LabelReconstructionAttack", run_status=status, status=why, source=SOURCE,
            inputs={"layer": self._layer_text(), "min_examples": self.min_examples,
                    "every_n_steps": self.every_n_steps},
            results=results,
            threat_model="sees the privatized aggregated gradient of one linear layer and the layer's "
                         "per-example inputs for the batch",
            layer=self._layer_text(), **self.coverage(), min_examples=self.min_examples,
            accuracy=self.published_accuracy, accuracy_examples=self._published["attacked"],
            count_accuracy=self.published_count_accuracy,
            count_accuracy_examples=self._published["count_attacked"])

    def _layer_text(self) -> str:
        """The attacked layer's repr (its shape, no value): the bound one, else the last one
        bound (a resumed fit that took no step yet states the checkpoint's)."""
        return repr(self.layer) if self.layer is not None else self._layer_repr

    def _status(self) -> str:
        if not self.attacked_steps:
            counted = " (the label counts were: see count_accuracy)" if self._totals["count_attacked"] else ""
            return f"not attacked: no step could be attacked (see skips){counted}"
        if self.published_accuracy is None:
            return (f"too few attacked examples: fewer than min_examples = {self.min_examples} (no accuracy "
                    "is published below that: it would tell which labels the attack got right)")
        return "ok"

    def report_section(self) -> tuple[str, dict[str, Any]]:
        """This audit's results for the audit report (written once every audit of the run
        finished)."""
        return ("label reconstruction attack (Yuan, Xue, Wang, Shen 2022)", {
            "status": self._status(),
            "accuracy": self.published_accuracy, "accuracy_examples": self._published["attacked"],
            "attacked_steps": self.attacked_steps, "considered_steps": self.considered,
            # the class count is known from the attacked layer, once a step was considered
            "num_classes": max(2, self._num_classes) if self.considered else None,
            "disabled_reason": self.disabled_reason})

    def state_dict(self) -> dict[str, Any]:
        """The published aggregates only (a checkpoint is an output too: totals one step ahead
        of the last checkpoint's give that step's accuracy); a resume drops the examples
        attacked since the last block of ``min_examples``. With them the coverage, the settings
        and the attacked layer as the summary states it (its repr and class count)."""
        return {**self._coverage_state(), "published": dict(self._published),
                "num_classes": self._num_classes, "layer": self._layer_text()}

    def _settings(self) -> dict[str, Any]:
        return {**super()._settings(), "min_examples": self.min_examples}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raises ValueError (naming the setting and both values) for a checkpoint of an audit
        at other settings (``every_n_steps``, ``min_examples``); one saved before the settings
        were kept loads as before."""
        self._load_coverage_state(state_dict)
        self._num_classes = int(state_dict.get("num_classes", self._num_classes))
        self._layer_repr = str(state_dict.get("layer", self._layer_repr))
        for k, v in state_dict.get("published", {}).items():
            if k in self._published:
                self._published[k] = int(v)
        self._totals = dict(self._published)
        self.history, self.count_history = [], []

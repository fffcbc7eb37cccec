"""Label-privacy callbacks for Opacus DP-SGD (paper 004, Yuan et al.; METHODS B1-B10).

* :class:`LabelReconstructionAttack` - the adversary sees the privatized aggregated gradient of
  one linear layer (default: the last) and the per-example inputs of that layer, and
  reconstructs the batch's labels (B2-B4). Logs the reconstruction accuracy of the batch and
  the running accuracy (torchmetrics).
* :class:`LabelDPLowerBound` - closed-form label-DP lower bounds for one step (B8, B9) from
  Opacus' per-example gradients, their extrapolation to the run (B10), the single-step upper
  bound for replacing one label (Gaussian with sensitivity 2/sigma) and the accountant's epsilon,
  on one TensorBoard chart next to accuracy.

Both read the training through two hooks: a forward hook on the attacked layer (its inputs and
outputs while a training batch runs) and a hook chained into the ``DPOptimizer``'s single
``step_hook`` slot (after clipping, noise and scaling, before the parameters move: ``p.grad`` is
the privatized gradient and ``p.grad_sample`` still holds the per-example gradients). The
accountant's own hook keeps running first.

Within one step the two callbacks share their expensive parts (:func:`_step_values`): the QR
factorisation of the last layer's inputs (:func:`~audit_callbacks.attacks.label_reconstruction.
factorize_layer`) and the per-example gradient norms. All linear algebra runs in torch, on the
threads the training already uses.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torchmetrics.functional.classification import binary_accuracy, multiclass_accuracy

from audit_callbacks.attacks.label_reconstruction import (
    LayerFactorization,
    factorize_layer,
    reconstruct_labels,
)
from audit_callbacks.callbacks import tensorboard as tb
from audit_callbacks.callbacks.summary import write_summary
from audit_callbacks.dpsgd import (
    accountant_epsilon,
    chain_step_hook,
    find_accountant,
    find_dp_optimizer,
    unchain_step_hook,
)
from audit_callbacks.estimators.gaussian import gaussian_epsilon
from audit_callbacks.estimators.label_dp import extrapolation_factor, label_dp_lower_bound

__all__ = ["LabelDPLowerBound", "LabelReconstructionAttack", "second_last_layer_features"]


# Work shared by the label callbacks within ONE optimizer step. A step is recognised by the
# identity of the first parameter's ``.grad``: DPOptimizer.add_noise assigns a new tensor every
# step, and the entry keeps that tensor alive, so its identity cannot be reused while cached.
_SHARED: weakref.WeakKeyDictionary[Any, tuple[torch.Tensor | None, dict[Any, Any]]] = weakref.WeakKeyDictionary()


def _release_step_values(optimizer: Any) -> None:
    """Drop the step's cache once the step is over: it references Opacus' per-example gradients
    (tens of MB), which would otherwise stay alive into the next backward pass and force fresh
    allocations there (measured: ~4 ms a step on the 2x200 MLP)."""
    if optimizer is not None:
        _SHARED.pop(optimizer, None)


def _step_values(optimizer: Any) -> dict[Any, Any]:
    """The cache of the current DP-SGD step (empty at the step's first use)."""
    marker = optimizer.params[0].grad if optimizer.params else None
    entry = _SHARED.get(optimizer)
    if entry is None or entry[0] is not marker or marker is None:
        entry = (marker, {})
        _SHARED[optimizer] = entry
    return entry[1]


def _shared_factorization(optimizer: Any, layer: nn.Module, x: torch.Tensor, bias: bool) -> LayerFactorization:
    """:func:`factorize_layer` of the layer's inputs ``x`` [N, p], once per step for all callbacks.

    Raises the factorisation's ValueError (N > p + 1, rank deficient) to every caller.
    """
    values = _step_values(optimizer)
    key = ("qr", id(layer), bias, tuple(x.shape))
    if key not in values:
        try:
            values[key] = factorize_layer(x, bias=bias)
        except ValueError as err:
            values[key] = err
    out = values[key]
    if isinstance(out, ValueError):
        raise out
    return out


def _grad_samples_by_param(optimizer: Any) -> dict[int, torch.Tensor]:
    """id(parameter) -> its per-example gradients [N, ...] (Opacus ``grad_samples``), once per step."""
    values = _step_values(optimizer)
    if "by_param" not in values:
        values["by_param"] = dict(zip(map(id, optimizer.params), optimizer.grad_samples, strict=True))
    return values["by_param"]


def _grad_norms(optimizer: Any) -> np.ndarray:
    """[N] norms of the whole per-example gradients (all parameters, before clipping), float64.

    The quantity Opacus' ``clip_and_accumulate`` clips with; recomputed from ``grad_samples``
    (Opacus does not keep it), once per step. Reads every per-example gradient (memory-bound,
    ~1 ms for 64 x 46,601 floats); :func:`_ghost_grad_norms` avoids that for all-Linear models.
    """
    values = _step_values(optimizer)
    if "norms" not in values:
        per_param = [torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1) for g in optimizer.grad_samples]
        norms = torch.linalg.vector_norm(torch.stack(per_param, dim=1), dim=1)
        values["norms"] = norms.detach().to("cpu", torch.float64).numpy()
    return values["norms"]


def _default_labels(batch: Any) -> torch.Tensor:
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        return batch[1]
    if isinstance(batch, dict) and "label" in batch:
        return batch["label"]
    raise ValueError("cannot find the labels in the batch: pass label_fn=lambda batch: ...")


def _linear_layers(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def second_last_layer_features(
    inputs: torch.Tensor, preactivations: torch.Tensor, last_weight: torch.Tensor, unit: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example dZ_r/dW for the weights (and bias) into hidden unit J of the last hidden layer.

    dZ_r/dW_J = W^L_J U_r [x_r^{L-1}, 1] with U_r = ReLU'(Z^L_J[r]) (METHODS B5; paper 004
    Alg. 4). Rows with U_r = 0 carry no information on the label (undetermined) and are dropped.

    Args:
        inputs: [N, p'] inputs of the second-last linear layer, x^{L-1}.
        preactivations: [N, H] its outputs Z^L (before the ReLU).
        last_weight: [1, H] weight of the last (logit) layer.
        unit: J in [0, H).

    Returns:
        ``(features [n_det, p' + 1], determined [N] bool)``: the effective features of the
        determined examples, to pass to :func:`label_dp_lower_bound` with ``bias=False``.
    """
    active = preactivations[:, unit] > 0
    w = float(last_weight.reshape(-1)[unit])
    ones = torch.ones(inputs.shape[0], 1, dtype=inputs.dtype, device=inputs.device)
    feats = w * torch.cat([inputs, ones], dim=1)
    return feats[active], active


class _LayerTap:
    """Forward hooks that keep the inputs/outputs of layers while a training batch runs.

    Between two optimizer steps the captured tensors of every forward pass are concatenated
    (gradient accumulation), and cleared after each step. ``norm_layers`` only record the
    squared norm of each example's input, for :func:`_ghost_grad_norms`.
    """

    def __init__(self, layers: dict[str, nn.Linear], norm_layers: dict[str, nn.Linear] | None = None) -> None:
        self.active = False
        self.inputs: dict[str, list[torch.Tensor]] = {k: [] for k in layers}
        self.outputs: dict[str, list[torch.Tensor]] = {k: [] for k in layers}
        self.sqnorms: dict[str, list[torch.Tensor]] = {k: [] for k in norm_layers or {}}
        self.labels: list[torch.Tensor] = []
        self._handles = [layer.register_forward_hook(self._hook(name)) for name, layer in layers.items()]
        self._handles += [layer.register_forward_hook(self._norm_hook(name)) for name, layer in (norm_layers or {}).items()]

    # The hooks only keep references (autograd saves a Linear's input for its backward anyway, so
    # it is not modified in place); conversions happen once per step in take().
    def _hook(self, name: str):
        def fn(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            if self.active and module.training:
                self.inputs[name].append(args[0].detach())
                self.outputs[name].append(output.detach())
        return fn

    def _norm_hook(self, name: str):
        def fn(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            if self.active and module.training:
                self.sqnorms[name].append(args[0].detach())
        return fn

    @staticmethod
    def _rows(chunks: list[torch.Tensor]) -> torch.Tensor:
        x = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
        return x.reshape(x.shape[0], -1).to("cpu", torch.float64)

    def take(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor,
                            dict[str, torch.Tensor] | None] | None:
        if not self.labels or any(not v for v in self.inputs.values()):
            self.clear()
            return None
        ins = {k: self._rows(v) for k, v in self.inputs.items()}
        outs = {k: self._rows(v) for k, v in self.outputs.items()}
        labels = torch.cat(self.labels)
        sq: dict[str, torch.Tensor] | None = None
        # the outer-product identity of _ghost_grad_norms needs [N, p] inputs and one call per
        # forward pass
        if self.sqnorms and all(len(v) == len(self.labels) and all(t.ndim == 2 for t in v)
                                for v in self.sqnorms.values()):
            sq = {k: torch.linalg.vector_norm(torch.cat(v), dim=1).to("cpu", torch.float64) ** 2
                  for k, v in self.sqnorms.items()}
        self.clear()
        return ins, outs, labels, sq

    def clear(self) -> None:
        for v in (*self.inputs.values(), *self.outputs.values(), *self.sqnorms.values()):
            v.clear()
        self.labels.clear()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def _gradient_scale(optimizer: Any, layer: nn.Linear, a: np.ndarray, x: torch.Tensor) -> float | None:
    """kappa with Opacus' per-example gradient of the logit layer = kappa (p_r - y_r) [x_r, 1].

    kappa = 1 for a per-example log-loss; Lightning's gradient accumulation divides the loss by
    ``accumulate_grad_batches`` (kappa = 1/2 for 2). Read from the layer's per-example bias
    gradients (weight gradients without a bias), row by row; None when the rows disagree by
    more than 1e-3 (then the loss is not log-loss on this logit and the bounds do not apply).
    """
    by_id = _grad_samples_by_param(optimizer)
    if layer.bias is not None and id(layer.bias) in by_id:
        ratio = by_id[id(layer.bias)].reshape(-1).to("cpu", torch.float64).numpy() / a
    elif id(layer.weight) in by_id:
        gw = by_id[id(layer.weight)]
        gn = torch.linalg.vector_norm(gw.reshape(gw.shape[0], -1), dim=1).to("cpu", torch.float64).numpy()
        ratio = gn / (np.abs(a) * torch.linalg.vector_norm(x, dim=1).numpy())
    else:
        return None
    if ratio.shape != a.shape:
        return None
    use = np.abs(a) > 1e-3  # float32 gradients: relative error ~1e-7 / |p - y|
    if not use.any():  # a batch the model fits almost perfectly: its best-determined row
        use = np.abs(a) >= np.abs(a).max()
    kappa = float(np.median(ratio[use]))
    if not (math.isfinite(kappa) and kappa > 0) or float(np.max(np.abs(ratio[use] / kappa - 1.0))) > 1e-3:
        return None
    return kappa


def _ghost_layers(module: nn.Module, optimizer: Any) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` layers (with a bias) that hold EVERY parameter the optimizer trains, or
    {} when some parameter lives elsewhere (then the norms are read from ``grad_samples``)."""
    params = {id(p) for p in optimizer.params}
    layers = {str(i): m for i, m in enumerate(module.modules()) if isinstance(m, nn.Linear) and m.bias is not None
              and id(m.weight) in params and id(m.bias) in params}
    covered = {id(p) for m in layers.values() for p in (m.weight, m.bias)}
    return layers if layers and covered == params and len(covered) == len(optimizer.params) else {}


def _ghost_grad_norms(optimizer: Any, layers: dict[str, nn.Linear], sqnorms: dict[str, torch.Tensor]) -> np.ndarray | None:
    """[N] per-example gradient norms of an all-``nn.Linear`` model from the bias gradients alone.

    For ``nn.Linear`` on [N, p] inputs, Opacus' per-example weight gradient is the outer product
    b_i a_i^T with b_i the per-example bias gradient and a_i the input, so the example's squared
    norm over the layer is ||b_i||^2 (||a_i||^2 + 1) (Goodfellow 2015, "Efficient per-example
    gradient computations"; the "ghost norm" of Li et al. 2022). That reads the [N, k] bias
    gradients instead of every [N, k, p] weight gradient. Equal to
    :func:`_grad_norms` up to float rounding (tests/test_label_callbacks.py). None when the
    shapes do not line up (the caller falls back to :func:`_grad_norms`).
    """
    by_id = _grad_samples_by_param(optimizer)
    total: torch.Tensor | None = None
    for name, layer in layers.items():
        b = by_id[id(layer.bias)]
        a2 = sqnorms[name]
        if b.shape[0] != a2.shape[0] or b.ndim != 2:
            return None
        part = torch.linalg.vector_norm(b, dim=1).to("cpu", torch.float64) ** 2 * (a2 + 1.0)
        total = part if total is None else total + part
    return None if total is None else torch.sqrt(total).numpy()


class _StepAuditCallback(Callback):
    """Shared glue: find the DPOptimizer and layers, tap them, chain the step hook."""

    name = "label audit"

    def __init__(self, *, every_n_steps: int, label_fn: Any, summary_filename: str | None) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = int(every_n_steps)
        self.label_fn = label_fn or _default_labels
        self.summary_filename = summary_filename
        self.optimizer: Any = None
        self._tap: _LayerTap | None = None
        self._hook: Any = None
        self._pending: dict[str, float] | None = None
        self._log_this_batch = True
        self._warned: set[str] = set()
        self.steps = 0
        self.summary_path: str | None = None

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(message, category=UserWarning)

    def _layers(self, pl_module: pl.LightningModule) -> dict[str, nn.Linear]:
        raise NotImplementedError

    def _norm_layers(self, pl_module: pl.LightningModule) -> dict[str, nn.Linear]:
        """Layers whose per-example input norms the tap records (see :func:`_ghost_grad_norms`)."""
        return {}

    def _on_step(self, optimizer: Any, data: tuple) -> dict[str, float] | None:
        raise NotImplementedError

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.optimizer = find_dp_optimizer(trainer.optimizers)
        if self.optimizer is None:
            raise TypeError(
                f"{type(self).__name__} audits Opacus DP-SGD: return the optimizer of "
                "PrivacyEngine().make_private(...) from configure_optimizers"
            )
        self._tap = _LayerTap(self._layers(pl_module), self._norm_layers(pl_module))
        self._hook = chain_step_hook(self.optimizer, self._step_hook)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._tap is None:
            return
        # per-step scalars follow the Trainer's log_every_n_steps, as `self.log(on_step=True)`
        # and LearningRateMonitor do; every attacked step stays in the records and the summary
        connector = getattr(trainer, "_logger_connector", None)
        self._log_this_batch = bool(getattr(connector, "should_update_logs", True))
        self._tap.active = True
        self._tap.labels.append(torch.as_tensor(self.label_fn(batch)).detach().reshape(-1).to("cpu"))

    def _step_hook(self, optimizer: Any) -> None:
        assert self._tap is not None
        self.steps += 1
        data = self._tap.take()
        if data is None or (self.steps - 1) % self.every_n_steps:
            return
        self._pending = self._on_step(optimizer, data)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        _release_step_values(self.optimizer)
        if self._tap is not None:
            self._tap.active = False
        if self._pending and self._log_this_batch:
            # straight to the loggers (as LearningRateMonitor does): one call per step instead of
            # a LightningModule.log per tag, which costs ~1 ms each
            metrics = {k: float(v) for k, v in self._pending.items() if v is not None and math.isfinite(v)}
            tb.log_scalars(trainer, metrics, int(trainer.global_step))
        self._pending = None

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._tap is not None:
            self._tap.remove()
            self._tap = None
        if self.optimizer is not None and self._hook is not None:
            unchain_step_hook(self.optimizer, self._hook)
            self._hook = None


class LabelReconstructionAttack(_StepAuditCallback):
    """Reconstruct training labels from the privatized aggregated gradient (paper 004 Alg. 1/3).

    Threat model: an honest-but-curious party that sees the gradient DP-SGD releases at a step
    (clipped, noised, divided by the expected batch size) for one linear layer, and the inputs
    of that layer for the batch's examples (white-box model, known batch features). Every
    ``every_n_steps`` logical steps it runs
    :func:`~audit_callbacks.attacks.label_reconstruction.reconstruct_labels` on
    ``(inputs [N, p], weight.grad [K, p], bias.grad [K])`` and compares with the true labels.

    Logs ``label_attack/accuracy_batch`` and ``label_attack/accuracy`` (running over every
    attacked example, torchmetrics) on the Trainer's ``log_every_n_steps`` steps, as
    ``self.log(on_step=True)`` does; ``history`` and ``label_attack_summary.json`` (fit end)
    hold every attacked step.

    Args:
        layer: the attacked ``nn.Linear`` (default: the last linear layer of the module).
        every_n_steps: attack one logical step in n.
        label_fn: ``batch -> labels [N]`` (default: ``batch[1]``).
        summary_filename: JSON written at fit end in the logger's directory (None: none).

    Raises:
        TypeError: no Opacus ``DPOptimizer`` among the trainer's optimizers (at fit start).
    Warns once (and skips the step) when the batch is larger than the layer allows
    (N > p + 1): use a smaller batch or attack a wider layer.
    """

    name = "label reconstruction"

    def __init__(
        self, layer: nn.Linear | None = None, *, every_n_steps: int = 1, label_fn: Any = None,
        summary_filename: str | None = "label_attack_summary.json",
    ) -> None:
        super().__init__(every_n_steps=every_n_steps, label_fn=label_fn, summary_filename=summary_filename)
        self.layer = layer
        self._num_classes = 1
        self.history: list[tuple[int, float, int]] = []  # (step, batch accuracy, batch size)

    def _layers(self, pl_module: pl.LightningModule) -> dict[str, nn.Linear]:
        if self.layer is None:
            layers = _linear_layers(pl_module)
            if not layers:
                raise ValueError("LabelReconstructionAttack: the module has no nn.Linear layer to attack")
            self.layer = layers[-1]
        self._num_classes = int(self.layer.out_features)
        return {"layer": self.layer}

    def _on_step(self, optimizer: Any, data: tuple) -> dict[str, float] | None:
        ins, _, labels, _ = data
        x = ins["layer"]
        layer = self.layer
        assert layer is not None
        if layer.weight.grad is None:
            return None
        w_grad = layer.weight.grad.detach().to("cpu", torch.float64)
        b_grad = None if layer.bias is None else layer.bias.grad.detach().to("cpu", torch.float64)
        if x.shape[0] > x.shape[1] + (b_grad is not None):
            self._warn_once("rank", f"LabelReconstructionAttack: a batch of {x.shape[0]} examples is larger than "
                            f"the attacked layer's {x.shape[1]} inputs allow; such steps are skipped "
                            "(use a smaller batch or attack a wider layer)")
            return None
        try:
            factor = _shared_factorization(optimizer, layer, x, b_grad is not None)
            pred = reconstruct_labels(x, w_grad, b_grad, factorization=factor)
        except ValueError as err:  # rank-deficient features, NaN/inf
            self._warn_once("solve", f"LabelReconstructionAttack: step skipped: {err}")
            return None
        target = labels.to(pred.dtype)
        if self._num_classes == 1:  # torchmetrics' functional form: no metric state to sync per step
            batch_acc = float(binary_accuracy(pred, target, validate_args=False))
        else:
            batch_acc = float(multiclass_accuracy(pred, target, num_classes=self._num_classes, average="micro",
                                                  validate_args=False))
        self.history.append((self.steps, batch_acc, int(x.shape[0])))
        return {"label_attack/accuracy_batch": batch_acc, "label_attack/accuracy": self.accuracy}

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        tb.add_custom_scalars_layout(trainer, {"label attack": {
            "reconstruction accuracy": ["Multiline", ["label_attack/accuracy_batch", "label_attack/accuracy"]],
            "model accuracy": ["Multiline", [r"val.*acc.*"]],
        }})

    @property
    def accuracy(self) -> float | None:
        """Running reconstruction accuracy over every attacked example (None before any)."""
        if not self.history:
            return None
        # micro average over examples = batch accuracies weighted by batch size (exact)
        return sum(a * n for _, a, n in self.history) / sum(n for _, _, n in self.history)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.summary_filename or not trainer.is_global_zero:
            return
        self.summary_path = write_summary(tb.log_dir(trainer), self.summary_filename, {
            "callback": "LabelReconstructionAttack",
            "paper": "Yuan et al., paper 004, Alg. 1 and 3; METHODS B2-B4",
            "threat_model": "sees the privatized aggregated gradient of one linear layer and the layer's "
                            "per-example inputs for the batch",
            "layer": repr(self.layer),
            "steps": self.steps,
            "attacked_steps": len(self.history),
            "accuracy": self.accuracy,
            "history": [{"step": s, "accuracy": a, "batch_size": n} for s, a, n in self.history],
        })

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "history": [list(h) for h in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = int(state_dict.get("steps", 0))
        self.history = [(int(s), float(a), int(n)) for s, a, n in state_dict.get("history", [])]


class LabelDPLowerBound(_StepAuditCallback):
    """Label-DP lower bounds of each DP-SGD step against the last-layer label attack (paper 004).

    For a binary model with one sigmoid logit (``nn.Linear(p, 1)`` last), every
    ``every_n_steps`` logical steps it computes, from the batch's last-hidden activations, the
    sigmoid outputs, the labels and Opacus' per-example gradient norms (over all parameters,
    before clipping: from the per-example bias gradients and input norms when every trained
    parameter is in an ``nn.Linear`` with a bias, else from ``grad_sample``),
    :func:`~audit_callbacks.estimators.label_dp.label_dp_lower_bound` (METHODS B8, B9) and
    logs, in nats at ``delta``, on the Trainer's ``log_every_n_steps`` steps (``records`` and the
    summary keep every attacked step):

    * ``label_dp/epsilon_lo_batch`` - the sign-test bound of this batch (B8, paper Alg. 2);
    * ``label_dp/epsilon_lo_max`` - its running maximum over the attacked steps;
    * ``label_dp/epsilon_lo_extrapolated`` - the mean batch bound times
      ``1 + log M / log N`` (B10; M attacked steps, N the expected batch size);
    * ``label_dp/epsilon_lo_optimal_test``, ``label_dp/epsilon_pair_layer``,
      ``label_dp/epsilon_pair_all_params`` - the B9 bounds of this batch (max over examples);
    * ``label_dp/epsilon_lo_second_last`` - the sign-test bound from the second-last layer
      (unit with the most active examples, B5), when ``second_last=True``;
    * ``label_dp/epsilon_single_step`` - the upper bound of one step for replacing one label, the
      Gaussian with sensitivity 2/sigma (no amplification);
    * ``label_dp/epsilon_accountant`` - the run's Opacus accountant (amplified, composed),
      logged at each training epoch end (the conversion is too slow for every step).

    Threat model: one release of one step on a batch the adversary knows (white-box). The
    single-step bound is the analytic ceiling of every per-batch value; the accountant's
    epsilon is for the whole run under Poisson sampling and add/remove neighbours.

    Args:
        every_n_steps: compute on one logical step in n.
        delta: delta of every epsilon (default: the module's ``delta`` or 1e-5).
        second_last: also bound the second-last layer's attack (needs a ReLU MLP whose last
            two layers are ``nn.Linear``); off by default, it doubles the cost of a step.
        label_fn: ``batch -> labels [N]`` in {0, 1} (default: ``batch[1]``).
        summary_filename: JSON at fit end (None: none).

    Raises:
        TypeError: no Opacus ``DPOptimizer`` (at fit start).
        ValueError: the last linear layer has more than one output (the closed forms are for a
            single sigmoid logit), or ``noise_multiplier`` is 0 (every bound is infinite).
    Warns once (and skips the step) when the batch is larger than the layer width allows.
    """

    name = "label-DP lower bound"

    def __init__(
        self, *, every_n_steps: int = 1, delta: float | None = None, second_last: bool = False,
        label_fn: Any = None, summary_filename: str | None = "label_dp_summary.json",
    ) -> None:
        super().__init__(every_n_steps=every_n_steps, label_fn=label_fn, summary_filename=summary_filename)
        if delta is not None and not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.delta = delta
        self.second_last = bool(second_last)
        self._delta_used = 1e-5
        self._accountant: Any = None
        self._ghost: dict[str, nn.Linear] = {}
        self.records: list[dict[str, float]] = []
        self.running_max = 0.0
        self.running_max_second_last = 0.0
        self._sum = 0.0
        self.accountant_epsilon: float | None = None

    def _layers(self, pl_module: pl.LightningModule) -> dict[str, nn.Linear]:
        layers = _linear_layers(pl_module)
        if not layers or layers[-1].out_features != 1:
            raise ValueError(
                "LabelDPLowerBound needs a binary model with one sigmoid logit (last layer nn.Linear(p, 1)); "
                "the closed forms of paper 004 Alg. 2 are for that case"
            )
        self._last = layers[-1]
        out = {"last": layers[-1]}
        if self.second_last:
            if len(layers) < 2:
                self._warn_once("sl", "LabelDPLowerBound: no second-last linear layer; second_last ignored")
                self.second_last = False
            else:
                out["second_last"] = layers[-2]
        return out

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        if float(self.optimizer.noise_multiplier) <= 0:
            raise ValueError("LabelDPLowerBound: noise_multiplier is 0, so no step is private (every bound is inf)")
        own = getattr(pl_module, "delta", None)
        self._delta_used = self.delta if self.delta is not None else (float(own) if own else 1e-5)
        self._accountant, _ = find_accountant(self.optimizer)
        lines = ["label_dp/epsilon_lo_batch", "label_dp/epsilon_lo_max", "label_dp/epsilon_lo_extrapolated",
                 "label_dp/epsilon_single_step", "label_dp/epsilon_accountant"]
        if self.second_last:
            lines.insert(3, "label_dp/epsilon_lo_second_last")
        tb.add_custom_scalars_layout(trainer, {"label privacy (paper 004)": {
            "label-DP epsilon: lower bounds vs upper bounds": ["Multiline", lines],
            "B9 bounds (one batch)": ["Multiline", ["label_dp/epsilon_lo_batch", "label_dp/epsilon_lo_optimal_test",
                                                    "label_dp/epsilon_pair_layer", "label_dp/epsilon_pair_all_params",
                                                    "label_dp/epsilon_single_step"]],
            "model accuracy": ["Multiline", [r"val.*acc.*"]],
        }})

    def _norm_layers(self, pl_module: pl.LightningModule) -> dict[str, nn.Linear]:
        self._ghost = _ghost_layers(pl_module, self.optimizer)
        return self._ghost

    def _on_step(self, optimizer: Any, data: tuple) -> dict[str, float] | None:
        ins, outs, labels, sq = data
        x = ins["last"]
        n, p = x.shape
        if n < 1:
            return None
        if n > p + 1:
            self._warn_once("rank", f"LabelDPLowerBound: a batch of {n} examples is larger than the last layer's "
                            f"{p} inputs (+1 bias) allow; such steps are skipped (use a smaller batch or a wider layer)")
            return None
        norms = _ghost_grad_norms(optimizer, self._ghost, sq) if (self._ghost and sq is not None) else None
        if norms is None:
            norms = _grad_norms(optimizer)
        probs = torch.sigmoid(outs["last"][:, 0]).clamp(1e-12, 1 - 1e-12).numpy()
        y = labels.numpy().astype(np.int64)
        kappa = _gradient_scale(optimizer, self._last, probs - y, x)
        if kappa is None:
            self._warn_once("scale", "LabelDPLowerBound: step skipped: the last layer's per-example gradients are "
                            "not kappa (p - y) [x, 1] with one kappa > 0 for the batch; the bounds need a binary "
                            "model trained with log-loss on one sigmoid logit (BCEWithLogitsLoss)")
            return None
        kw = dict(max_grad_norm=float(optimizer.max_grad_norm), noise_multiplier=float(optimizer.noise_multiplier),
                  expected_batch_size=float(optimizer.expected_batch_size), delta=self._delta_used,
                  grad_scale=kappa)
        try:
            v = _shared_factorization(optimizer, self._last, x, self._last.bias is not None).gram_inv_diag
            res = label_dp_lower_bound(x.numpy(), probs, y, norms, bias=self._last.bias is not None,
                                       gram_inv_diag=v.numpy(), **kw)
        except ValueError as err:
            self._warn_once("solve", f"LabelDPLowerBound: step skipped: {err}")
            return None
        lb = float(res.epsilon_lower_bound)
        self.running_max = max(self.running_max, lb)
        self._sum += lb
        attacked = len(self.records) + 1
        mean = self._sum / attacked
        n_e = max(2, int(round(float(optimizer.expected_batch_size))))
        record = {
            "step": float(self.steps),
            "label_dp/epsilon_lo_batch": lb,
            "label_dp/epsilon_lo_max": self.running_max,
            "label_dp/epsilon_lo_extrapolated": mean * extrapolation_factor(attacked, n_e),
            "label_dp/epsilon_lo_optimal_test": float(res.optimal_test_epsilon_max),
            "label_dp/epsilon_pair_layer": float(res.layer_pair_epsilon_max),
            "label_dp/epsilon_pair_all_params": float(res.all_params_pair_epsilon_max),
            "label_dp/epsilon_single_step": float(res.single_step_epsilon),
        }
        if self.second_last:
            sl = self._second_last(ins, outs, probs, y, norms, kw)
            if sl is not None:
                self.running_max_second_last = max(self.running_max_second_last, sl)
                record["label_dp/epsilon_lo_second_last"] = sl
        self.records.append(record)
        return {k: v for k, v in record.items() if k != "step"}

    def _second_last(self, ins, outs, probs, y, norms, kw) -> float | None:
        z = outs["second_last"]
        unit = int((z > 0).sum(0).argmax())
        feats, active = second_last_layer_features(ins["second_last"], z, self._last.weight.detach().cpu(), unit)
        if feats.shape[0] < 1 or feats.shape[0] > feats.shape[1]:
            return None
        mask = active.numpy()
        try:
            v = factorize_layer(feats, bias=False).gram_inv_diag.numpy()
            res = label_dp_lower_bound(feats.numpy(), probs[mask], y[mask], norms[mask], bias=False,
                                       gram_inv_diag=v, **kw)
        except ValueError:
            return None
        return float(res.epsilon_lower_bound)

    def _accountant_epsilon(self) -> float | None:
        return accountant_epsilon(self._accountant, self._delta_used)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.accountant_epsilon = self._accountant_epsilon()
        if self.accountant_epsilon is not None:
            pl_module.log("label_dp/epsilon_accountant", self.accountant_epsilon, on_step=False, on_epoch=True)

    @property
    def single_step_epsilon(self) -> float | None:
        if self.optimizer is None:
            return None
        return float(gaussian_epsilon(float(self.optimizer.noise_multiplier), self._delta_used, sensitivity=2.0))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.summary_filename or not trainer.is_global_zero:
            return
        last = self.records[-1] if self.records else {}
        self.summary_path = write_summary(tb.log_dir(trainer), self.summary_filename, {
            "callback": "LabelDPLowerBound",
            "paper": "Yuan et al., paper 004, Alg. 2 and App. A.3.1; METHODS B7-B10",
            "threat_model": "one release of one DP-SGD step on a known batch; the adversary runs the "
                            "last-layer (and second-last-layer) label attack",
            "delta": self._delta_used,
            "noise_multiplier": float(self.optimizer.noise_multiplier) if self.optimizer is not None else None,
            "max_grad_norm": float(self.optimizer.max_grad_norm) if self.optimizer is not None else None,
            "expected_batch_size": self.optimizer.expected_batch_size if self.optimizer is not None else None,
            "steps": self.steps,
            "attacked_steps": len(self.records),
            "epsilon_lower_bound_max": self.running_max,
            "epsilon_lower_bound_second_last_max": self.running_max_second_last if self.second_last else None,
            "epsilon_lower_bound_extrapolated": last.get("label_dp/epsilon_lo_extrapolated"),
            "epsilon_single_step": self.single_step_epsilon,
            "epsilon_accountant": self._accountant_epsilon(),
            "records": self.records,
        })

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "records": [dict(r) for r in self.records], "running_max": self.running_max,
                "running_max_second_last": self.running_max_second_last, "sum": self._sum}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = int(state_dict.get("steps", 0))
        self.records = [dict(r) for r in state_dict.get("records", [])]
        self.running_max = float(state_dict.get("running_max", 0.0))
        self.running_max_second_last = float(state_dict.get("running_max_second_last", 0.0))
        self._sum = float(state_dict.get("sum", 0.0))

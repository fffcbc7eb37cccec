"""The per-step work the two label callbacks share, held by an explicit object.

:class:`LabelStepObserver` caches, within ONE DP-SGD step, the QR factorisation of the attacked
layer's inputs (:func:`~audit_callbacks.attacks.label_reconstruction.factorize_layer`) and the
per-example gradient norms, so that :class:`~audit_callbacks.callbacks.label_reconstruction.
LabelReconstructionAttack` and :class:`~audit_callbacks.callbacks.label_dp.LabelDPLowerBound`
factorise once per step between them. Pass one observer to both (``observer=``), or let each
callback fetch the one attached to the optimizer with :meth:`LabelStepObserver.attached` (the
default: created on first use and stored as the optimizer's ``label_step_observer``
attribute). :class:`LayerTap` records the inputs and outputs of the tapped layers between two
optimizer steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from audit_callbacks.attacks.label_gradients import per_example_grad_norms
from audit_callbacks.attacks.label_reconstruction import LayerFactorization, factorize_layer

__all__ = ["LabelStepObserver", "LayerTap"]


class LabelStepObserver:
    """Per-step cache shared by the label callbacks of one DP-SGD optimizer.

    A step is recognised by the identity of the first parameter's ``.grad``: Opacus'
    ``DPOptimizer.add_noise`` assigns a new tensor every step, and the observer keeps that tensor
    alive while it caches, so the identity cannot be reused. :meth:`release` drops the cache at
    the step's end (it references Opacus' per-example gradients, tens of MB, which would
    otherwise stay alive into the next backward pass and force fresh allocations there).
    """

    ATTRIBUTE = "label_step_observer"

    def __init__(self) -> None:
        self._marker: torch.Tensor | None = None
        self._values: dict[Any, Any] = {}

    @classmethod
    def attached(cls, optimizer: Any) -> LabelStepObserver:
        """The observer attached to ``optimizer`` (created and attached on first use)."""
        obs = getattr(optimizer, cls.ATTRIBUTE, None)
        if not isinstance(obs, cls):
            obs = cls()
            setattr(optimizer, cls.ATTRIBUTE, obs)
        return obs

    def values(self, optimizer: Any) -> dict[Any, Any]:
        """The cache of the current step (empty at the step's first use)."""
        marker = optimizer.params[0].grad if optimizer.params else None
        if marker is None or marker is not self._marker:
            self._marker, self._values = marker, {}
        return self._values

    def release(self) -> None:
        self._marker, self._values = None, {}

    def factorization(self, optimizer: Any, layer: nn.Module, x: torch.Tensor, bias: bool) -> LayerFactorization:
        """:func:`factorize_layer` of the layer's inputs ``x`` [N, p], once per step.

        Raises the factorisation's ValueError (N > p + 1, rank deficient) to every caller.
        """
        values = self.values(optimizer)
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

    def grad_samples_by_param(self, optimizer: Any) -> dict[int, torch.Tensor]:
        """id(parameter) -> its per-example gradients [N, ...] (Opacus ``grad_samples``)."""
        values = self.values(optimizer)
        if "by_param" not in values:
            values["by_param"] = dict(zip(map(id, optimizer.params), optimizer.grad_samples, strict=True))
        return values["by_param"]

    def grad_norms(self, optimizer: Any) -> np.ndarray:
        """[N] norms of the whole per-example gradients (all parameters, before clipping)."""
        values = self.values(optimizer)
        if "norms" not in values:
            values["norms"] = per_example_grad_norms(optimizer.grad_samples)
        return values["norms"]


class LayerTap:
    """Forward hooks that keep the inputs/outputs of layers while a training batch runs.

    Between two optimizer steps the captured tensors of every forward pass are concatenated
    (gradient accumulation), and cleared after each step. ``norm_layers`` record their inputs
    too (for the ghost norms and the per-label gradient norms of
    :mod:`audit_callbacks.attacks.label_gradients`).
    """

    def __init__(self, layers: dict[str, nn.Linear], norm_layers: dict[str, nn.Linear] | None = None) -> None:
        self.active = False
        self.inputs: dict[str, list[torch.Tensor]] = {k: [] for k in layers}
        self.outputs: dict[str, list[torch.Tensor]] = {k: [] for k in layers}
        self.norm_inputs: dict[str, list[torch.Tensor]] = {k: [] for k in norm_layers or {}}
        self.labels: list[torch.Tensor] = []
        self._handles = [layer.register_forward_hook(self._hook(name)) for name, layer in layers.items()]
        self._handles += [layer.register_forward_hook(self._norm_hook(name))
                          for name, layer in (norm_layers or {}).items()]

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
                self.norm_inputs[name].append(args[0].detach())
        return fn

    @staticmethod
    def _rows(chunks: list[torch.Tensor]) -> torch.Tensor:
        x = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
        return x.reshape(x.shape[0], -1).to("cpu", torch.float64)

    def take(self) -> dict[str, Any] | None:
        """``{"inputs", "outputs", "labels", "norm_inputs"}`` of the step, or None when the step
        had no example: no batch, or only empty ones (Opacus' Poisson ``DPDataLoader`` yields a
        batch of size 0 with probability (1 - q)^n; its [0, ...] activations cannot be reshaped
        to rows, so they are dropped here and the callback skips the step as ``empty_batch``)."""
        empty = not self.labels or sum(int(t.numel()) for t in self.labels) == 0
        if empty or any(not v for v in self.inputs.values()):
            self.clear()
            return None
        out: dict[str, Any] = {
            "inputs": {k: self._rows(v) for k, v in self.inputs.items()},
            "outputs": {k: self._rows(v) for k, v in self.outputs.items()},
            "labels": torch.cat(self.labels),
            "norm_inputs": None,
        }
        # the ghost-norm identity needs [N, p] inputs and one call per forward pass
        if self.norm_inputs and all(len(v) == len(self.labels) and all(t.ndim == 2 for t in v)
                                    for v in self.norm_inputs.values()):
            out["norm_inputs"] = {k: torch.cat(v) for k, v in self.norm_inputs.items()}
        self.clear()
        return out

    def clear(self) -> None:
        for v in (*self.inputs.values(), *self.outputs.values(), *self.norm_inputs.values()):
            v.clear()
        self.labels.clear()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

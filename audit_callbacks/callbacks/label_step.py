"""The per-step work the two label callbacks share, held by an explicit object.

:class:`LabelStepObserver` caches, within ONE DP-SGD step, the QR factorisation of the attacked
layer's inputs (:func:`~audit_callbacks.attacks.label_reconstruction.factorize_layer`) and the
per-example gradient norms, so that :class:`~audit_callbacks.callbacks.label_reconstruction.
LabelReconstructionAttack` and :class:`~audit_callbacks.callbacks.label_dp.LabelDPLowerBound`
factorise once per step between them. Pass one observer to both (``observer=``), or let each
callback fetch the one attached to the optimizer with :meth:`LabelStepObserver.attached` (the
default: created on first use and stored as the optimizer's ``label_step_observer``
attribute). :class:`LayerTap` records the inputs and outputs of the tapped layers between two
optimizer steps; :class:`HeadProbe` finds, on the first step, the ``nn.Linear`` layer whose
output is the model's output (the logit layer the callbacks attack).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from audit_callbacks.attacks.label_gradients import per_example_grad_norms
from audit_callbacks.attacks.label_reconstruction import LayerFactorization, factorize_layer

__all__ = ["HeadProbe", "LabelStepObserver", "LayerTap"]


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
        self._layers = dict(layers)
        self._layer_handles = [layer.register_forward_hook(self._hook(name)) for name, layer in layers.items()]
        self._handles = [layer.register_forward_hook(self._norm_hook(name))
                         for name, layer in (norm_layers or {}).items()]

    def narrow(self, layers: dict[str, nn.Linear]) -> None:
        """Keep only ``layers`` (each one of the tapped layers, under a new name), with what they
        captured since the last step; the other layers' hooks are removed.

        Raises:
            ValueError: a layer of ``layers`` that is not tapped.
        """
        by_id = {id(layer): name for name, layer in self._layers.items()}
        missing = [name for name, layer in layers.items() if id(layer) not in by_id]
        if missing:
            raise ValueError(f"layers: {missing} are not tapped")
        self.inputs = {new: self.inputs[by_id[id(layer)]] for new, layer in layers.items()}
        self.outputs = {new: self.outputs[by_id[id(layer)]] for new, layer in layers.items()}
        for h in self._layer_handles:
            h.remove()
        self._layers = dict(layers)
        self._layer_handles = [layer.register_forward_hook(self._hook(name)) for name, layer in layers.items()]

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
        for h in (*self._layer_handles, *self._handles):
            h.remove()
        self._layer_handles, self._handles = [], []


class HeadProbe:
    """Finds the ``nn.Linear`` layer whose output is the model's output, from one training batch.

    The registration order of a module's layers (``module.modules()``) need not be the order
    they run in: a logit head declared first, or a weight-tied ``nn.Linear`` declared after it,
    would make "the last registered ``nn.Linear``" a hidden layer. The probe instead hooks every
    submodule while ``active`` (one training batch, then :meth:`remove`) and records

    * the ``nn.Linear`` calls, in the order they run, with their outputs;
    * the outputs of the outermost calls (a submodule called while no other hooked module runs:
      the module the training step calls, e.g. the ``LightningModule`` itself or its network;
      of a tuple its first element, of a mapping its ``"logits"``, else its first value).

    The model's output (the logits) is the last outermost output (a loss or a metric,
    0-dimensional, is passed over) that is the output of an ``nn.Linear`` call, or has its rows
    and size (an element-wise function after the head, e.g. a ReLU or a squeeze, keeps them);
    the head is the last ``nn.Linear`` called with that output. ``previous`` is the last other ``nn.Linear`` called before
    the head (the second-last layer of Yuan et al. 2022, Alg. 4).
    """

    def __init__(self, module: nn.Module) -> None:
        self.active = False
        self._depth = 0
        self.calls: list[tuple[nn.Linear, torch.Tensor]] = []  # (layer, its output), in call order
        self.outermost: list[torch.Tensor] = []  # outputs of the outermost calls
        self._handles: list[Any] = []
        for m in module.modules():
            self._handles.append(m.register_forward_pre_hook(self._enter))
            self._handles.append(m.register_forward_hook(self._leave, always_call=True))

    def begin(self) -> None:
        """Start recording a training batch (what an earlier batch recorded is dropped)."""
        self.calls, self.outermost, self._depth, self.active = [], [], 0, True

    def _enter(self, module: nn.Module, args: Any) -> None:
        if self.active:
            self._depth += 1

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self.active:
            return
        self._depth = max(0, self._depth - 1)
        if isinstance(output, Mapping):  # {"logits": ...}, as Hugging Face's ModelOutput
            output = output.get("logits", next(iter(output.values()), None))
        elif isinstance(output, (tuple, list)) and output:
            output = output[0]  # (logits, ...) as many models return
        if not isinstance(output, torch.Tensor) or not module.training:
            return
        if isinstance(module, nn.Linear):
            self.calls.append((module, output))
        if self._depth == 0:
            self.outermost.append(output)

    def resolve(self) -> tuple[nn.Linear, nn.Linear | None, list[nn.Linear]] | str:
        """``(head, previous, linear layers in call order)``, or the reason (text) why no
        ``nn.Linear`` layer's output is the model's output."""
        if not self.calls:
            return "no nn.Linear layer ran in the training step"
        index = None
        for out in reversed([o for o in self.outermost if o.ndim >= 1]):
            index = next((i for i in range(len(self.calls) - 1, -1, -1) if self.calls[i][1] is out), None)
            if index is None:
                index = next((i for i in range(len(self.calls) - 1, -1, -1) if self.calls[i][1].ndim >= 1
                              and self.calls[i][1].shape[0] == out.shape[0]
                              and self.calls[i][1].numel() == out.numel()), None)
            if index is not None:
                break
        if index is None:
            shapes = sorted({tuple(o.shape) for o in self.outermost if o.ndim >= 1})
            widths = sorted({int(layer.out_features) for layer, _ in self.calls})
            return (f"no nn.Linear layer's output is the model's output (outputs of shape {shapes}; the "
                    f"nn.Linear layers called have {widths} outputs)")
        head = self.calls[index][0]
        previous = next((layer for layer, _ in reversed(self.calls[:index]) if layer is not head), None)
        order: list[nn.Linear] = []
        for layer, _ in self.calls:
            if all(layer is not seen for seen in order):
                order.append(layer)
        return head, previous, order

    def remove(self) -> None:
        """Remove the hooks and drop what was recorded."""
        for h in self._handles:
            h.remove()
        self._handles, self.calls, self.outermost, self.active = [], [], [], False

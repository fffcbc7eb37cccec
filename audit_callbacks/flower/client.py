"""A Flower client's local training for torch models (what the example's ClientApp and the
tests run): local SGD from the global model, as ``DPFedAvg`` does for its clients
(``audit_callbacks/federated/dp_fedavg.py``, ``_local_update``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

__all__ = ["evaluate_accuracy", "local_sgd"]


def local_sgd(
    model: nn.Module,
    arrays: ArrayRecord,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int = 1,
    lr: float = 0.1,
    batch_size: int = 16,
    generator: torch.Generator | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
) -> tuple[ArrayRecord, float]:
    """Load ``arrays`` into ``model``, run ``epochs`` epochs of plain SGD on ``(x, y)``, and
    return the new model's ``ArrayRecord`` and the mean training loss.

    Args:
        model: the client's copy of the model (modified in place).
        arrays: the global model (its ``to_torch_state_dict()`` loads into ``model``).
        x: features ``[n, ...]``; y: integer labels ``[n]``.
        epochs, lr, batch_size: the local SGD (shuffled mini-batches from ``generator``).

    Raises:
        ValueError: no examples, or a non-finite loss (lower ``lr``).
    """
    if len(x) == 0:
        raise ValueError("local_sgd: the client has no examples")
    model.load_state_dict(arrays.to_torch_state_dict())
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    losses = []
    for _ in range(int(epochs)):
        perm = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), int(batch_size)):
            idx = perm[start:start + int(batch_size)]
            loss = loss_fn(model(x[idx]), y[idx])
            if not torch.isfinite(loss):
                raise ValueError("local_sgd: the loss is not finite; lower lr")
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    if g is not None:
                        p.sub_(g, alpha=float(lr))
            losses.append(float(loss.detach()))
    mean = sum(losses) / len(losses) if losses else float("nan")
    return ArrayRecord(model.state_dict()), mean


@torch.no_grad()
def evaluate_accuracy(model: nn.Module, arrays: ArrayRecord, x: torch.Tensor, y: torch.Tensor
                      ) -> tuple[float, float]:
    """``(loss, accuracy)`` of the model ``arrays`` on ``(x, y)`` (accuracy in [0, 1])."""
    model.load_state_dict(arrays.to_torch_state_dict())
    model.eval()
    logits = model(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(-1) == y).float().mean())

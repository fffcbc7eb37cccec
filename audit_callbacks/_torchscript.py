"""TorchScript for the few small kernels that run beside training on a background thread.

A compiled function runs its whole body in one call that holds no GIL, so a thread that
generates canaries takes the GIL back from the training thread once a call instead of once a
torch operation (measured beside a training loop, generating 25% of the time: the loop slowed by
1.3% with a Python loop of per-canary calls, by nothing measurable with the compiled one).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

import torch

__all__ = ["compile_or_python"]

F = TypeVar("F", bound=Callable[..., object])


def compile_or_python(fn: F) -> F:
    """``torch.jit.script(fn)``, or ``fn`` itself where TorchScript cannot compile it (the same
    ATen calls in the same order, so the same bits; tested). ``torch.jit.script`` warns that it
    is deprecated (torch >= 2.9) but has no replacement that runs without a C++ compiler."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.jit.script(fn)  # type: ignore[return-value]
    except Exception:  # noqa: BLE001 - any failure to compile leaves the plain Python function
        return fn

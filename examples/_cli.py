"""The ``--accelerator {auto,cpu,gpu}`` flag shared by the examples and the benchmarks (issue 28).

Not part of the library. The examples import it as ``_cli`` (each puts this folder on
``sys.path``; the name ``examples`` is taken in site-packages by Opacus' own examples package);
``benchmarks/_common.py`` re-exports it for the benchmarks.

``auto`` (the default) picks a CUDA GPU when torch sees one and the CPU otherwise, so a
CPU-only machine runs every script unchanged; ``gpu`` insists on CUDA. Pass
:func:`trainer_kwargs` to ``pl.Trainer`` and move hand-built tensors and models to
:func:`torch_device`.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

ACCELERATORS = ("auto", "cpu", "gpu")


def add_accelerator_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--accelerator {auto,cpu,gpu}`` (default ``auto``) to ``parser``."""
    parser.add_argument(
        "--accelerator", choices=ACCELERATORS, default="auto",
        help="where the Trainer runs: auto (default: a CUDA GPU when torch sees one, else the CPU), "
             "cpu, or gpu (CUDA; an error without one)",
    )


def resolve_accelerator(accelerator: str) -> str:
    """``"cpu"`` or ``"gpu"`` for a value of ``--accelerator``.

    ``auto`` is ``gpu`` exactly when ``torch.cuda.is_available()``, else ``cpu``.

    Raises:
        ValueError: ``accelerator`` is not one of ``auto``, ``cpu``, ``gpu``, or it is ``gpu``
            and torch sees no CUDA device.
    """
    if accelerator not in ACCELERATORS:
        raise ValueError(f"accelerator must be one of {', '.join(ACCELERATORS)}, got {accelerator!r}")
    cuda = torch.cuda.is_available()
    if accelerator == "gpu" and not cuda:
        raise ValueError("accelerator='gpu' (--accelerator gpu) needs a CUDA device, and torch sees none "
                         "(torch.cuda.is_available() is False): use --accelerator cpu or auto")
    return "gpu" if accelerator == "gpu" or (accelerator == "auto" and cuda) else "cpu"


def trainer_kwargs(accelerator: str) -> dict[str, Any]:
    """``pl.Trainer`` keyword arguments for ``accelerator``: ``{"accelerator": "cpu" | "gpu",
    "devices": 1}`` (one device: ``DPFedAvg`` and the examples are single-process).

    Raises:
        ValueError: as :func:`resolve_accelerator`.
    """
    return {"accelerator": resolve_accelerator(accelerator), "devices": 1}


def torch_device(accelerator: str) -> torch.device:
    """The torch device the Trainer of ``accelerator`` trains on: ``cuda`` (the current CUDA
    device) for ``gpu``, else ``cpu``.

    Raises:
        ValueError: as :func:`resolve_accelerator`.
    """
    return torch.device("cuda" if resolve_accelerator(accelerator) == "gpu" else "cpu")


def device_name(device: torch.device) -> str:
    """A readable name of ``device``: the GPU's (``torch.cuda.get_device_name``) or the CPU's
    with torch's thread count, for result files."""
    import platform

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads)"

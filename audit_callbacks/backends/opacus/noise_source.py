"""Where an Opacus optimizer draws its DP noise from, and whether anyone can replay it.

Opacus draws the noise of ``add_noise`` from the optimizer's ``generator``: the
``noise_generator`` given to ``make_private``, the cryptographically secure generator of
``PrivacyEngine(secure_mode=True)``, or, when neither was given, torch's default generator of
the noise's device. That default generator is seeded from OS entropy when the process starts,
but ``lightning.seed_everything(42)`` or ``torch.manual_seed(42)`` reseed it: the noise of every
step is then a function of a small public integer, replayable by anyone who knows it (from a
script, a log or ``hparams.yaml``), and the claim no longer holds against them (tapas #101,
Fed-BioMed #973). A ``torch.Generator()`` that is never seeded starts from the fixed
``67280421310721``: as public as any other constant.

A seed counts as public when it is below 2^32 (``seed_everything`` takes 32-bit seeds; a
64-bit seed drawn from OS entropy falls there with probability 2^-32), equals torch's default
seed of a new generator, or equals a seed the run logged. One run's releases cannot tell a
leaked seed apart from fresh entropy, so this is a look at the optimizer, not a statistic.

The same look at the training loader (:func:`batch_source`) says which sampling the claim
assumes: the accountant's epsilon is amplified by Poisson sampling, which holds only while the
batches are secret; an Opacus ``DPDataLoader`` whose generator is seeded from a public seed
publishes them, and the claim for anyone holding that seed is the unamplified one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch
from opacus.utils.uniform_sampler import UniformWithReplacementSampler

__all__ = ["NEW_GENERATOR_SEED", "SECRET_BATCHES", "BatchSource", "NoiseSource", "batch_source",
           "noise_source", "public_seed"]

#: the initial seed of a ``torch.Generator()`` that was never seeded
NEW_GENERATOR_SEED = 67280421310721

_FIX = ("draw the noise from a generator seeded from OS entropy: PrivacyEngine(secure_mode=True) "
        "(needs torchcsprng), or make_private(..., noise_generator=torch.Generator(device)"
        ".manual_seed(int.from_bytes(os.urandom(8), 'little')))")


#: What the summary says of a loader whose Poisson batches no logged or small seed replays.
SECRET_BATCHES = "secret Poisson batches (the claim is amplified by sampling)"


class BatchSource:
    """What :func:`batch_source` found.

    Attributes:
        known: True when the batches replay from a public seed (the amplified claim does not
            hold for anyone holding it), False when secret, None when not checked.
        sampling: one sentence for the summary's ``claim_sampling``: which sampling the
            claim assumes and whether this run's is it.
    """

    def __init__(self, known: bool | None, sampling: str) -> None:
        self.known, self.sampling = known, sampling

    def __repr__(self) -> str:
        return f"BatchSource(known={self.known!r})"


def batch_source(loader: Any, *, logged_seeds: Iterable[int] = (),
                 public_seeds: Iterable[int] = ()) -> BatchSource:
    """Whether ``loader``'s Poisson batches (an Opacus ``DPDataLoader``'s
    ``UniformWithReplacementSampler``) replay from a public seed.

    Args:
        loader: the training loader (None: not checked).
        logged_seeds: seeds the run logged (the module's and datamodule's hyperparameters).
        public_seeds: further public seeds that are not the training's own (the audit's canary
            seed): a generator seeded with one reads as known, without naming it (the text
            would tell which seed the training used).

    Returns:
        A :class:`BatchSource`. A generator seeded with a logged seed N reads as
        :func:`~audit_callbacks.federated.sampling.sampling_mark` marks it (``reproducible from
        seed N: ...``; N is logged already); one seeded otherwise publicly names no seed.
    """
    sampler = getattr(loader, "batch_sampler", None)
    if loader is None or sampler is None:
        return BatchSource(None, "not checked: no training loader was found; the claim assumes "
                                 "secret Poisson batches")
    if not isinstance(sampler, UniformWithReplacementSampler):
        return BatchSource(None, f"not checked: the training loader's batches come from "
                                 f"{type(sampler).__name__}, not Opacus' Poisson sampler; the "
                                 "accountant's claim assumes secret Poisson batches")
    generator = getattr(sampler, "generator", None)
    gen = generator if generator is not None else torch.default_generator
    try:
        seed = int(gen.initial_seed())
    except (AttributeError, RuntimeError):
        return BatchSource(False, SECRET_BATCHES)
    logged = {int(s) for s in logged_seeds if isinstance(s, int) and not isinstance(s, bool)}
    if seed in logged:
        return BatchSource(True, f"reproducible from seed {seed}: the claim assumes secret "
                                 "batches and does not hold for anyone holding the logs")
    if public_seed(seed, logged | {int(s) for s in public_seeds}):
        origin = ("torch's global generator, seeded with a public seed (seed_everything or "
                  "torch.manual_seed)" if generator is None else "a generator seeded with a public seed")
        return BatchSource(True, f"known: the Poisson batches are drawn from {origin}; the claim "
                                 "assumes secret batches and does not hold for anyone who knows "
                                 "the seed")
    return BatchSource(False, SECRET_BATCHES)


class NoiseSource:
    """What :func:`noise_source` found.

    Attributes:
        kind: ``"secure"`` (``secure_mode`` with its generator), ``"own generator"`` (the
            optimizer's ``noise_generator``) or ``"global generator"`` (torch's default one).
        replayable: whether the noise is replayable from a public seed.
        message: one sentence for the summary and a warning (None when not replayable); it
            never holds the seed itself.
    """

    def __init__(self, kind: str, replayable: bool, message: str | None) -> None:
        self.kind, self.replayable, self.message = kind, replayable, message

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "replayable": self.replayable, "message": self.message}

    def __repr__(self) -> str:
        return f"NoiseSource(kind={self.kind!r}, replayable={self.replayable})"


def public_seed(seed: int, logged_seeds: Iterable[int] = ()) -> bool:
    """Whether a generator's initial ``seed`` is public: below 2^32, the default seed of a new
    ``torch.Generator``, Lightning's ``PL_GLOBAL_SEED``, or one of ``logged_seeds``."""
    seed = int(seed)
    env = os.environ.get("PL_GLOBAL_SEED")
    known = {int(s) for s in logged_seeds if isinstance(s, (int,)) and not isinstance(s, bool)}
    if env is not None and env.lstrip("-").isdigit():
        known.add(int(env))
    return seed < 2**32 or seed == NEW_GENERATOR_SEED or seed in known


def _default_generator(device: torch.device) -> torch.Generator:
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


def noise_source(optimizer: Any, *, device: torch.device | str | None = None,
                 logged_seeds: Iterable[int] = ()) -> NoiseSource:
    """Where ``optimizer`` (an Opacus ``DPOptimizer``) draws its noise from, and whether the
    noise is replayable from a public seed.

    Args:
        optimizer: the ``DPOptimizer`` (reads its ``generator`` and ``secure_mode``).
        device: the device of the noise (default: the first parameter's).
        logged_seeds: seeds the run logged (hyperparameters), each public.

    Returns:
        A :class:`NoiseSource`; its ``message`` names the seed's origin and the fix, never
        the seed.
    """
    generator = getattr(optimizer, "generator", None)
    if getattr(optimizer, "secure_mode", False) and generator is not None:
        return NoiseSource("secure", False, None)
    if device is None:
        params = getattr(optimizer, "params", None) or [
            p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]
        device = params[0].device if params else torch.device("cpu")
    device = torch.device(device)
    kind = "own generator" if generator is not None else "global generator"
    gen = generator if generator is not None else _default_generator(device)
    try:
        seed = int(gen.initial_seed())
    except (AttributeError, RuntimeError):  # a generator without a seed to read
        return NoiseSource(kind, False, None)
    if not public_seed(seed, logged_seeds):
        return NoiseSource(kind, False, None)
    if generator is None:
        origin = ("torch's global generator, seeded with a public seed (seed_everything or "
                  "torch.manual_seed)")
    elif seed == NEW_GENERATOR_SEED:
        origin = "a noise_generator that was never seeded (torch's fixed default seed)"
    else:
        origin = "a noise_generator seeded with a public seed"
    message = (f"the DP noise is replayable: Opacus draws it from {origin}; anyone who knows "
               f"the seed can subtract the noise, and the claimed epsilon does not hold against "
               f"them. To fix it, {_FIX}")
    return NoiseSource(kind, True, message)

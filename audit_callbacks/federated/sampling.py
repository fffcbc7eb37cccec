"""Cohort sampling for DP-FedAvg rounds (Andrew et al. 2024 §4: canaries are sampled like real clients).

Three rules over a population of N client ids ``0..N-1``:

* ``"uniform"``: each round, a cohort of exactly m ids uniformly without replacement.
* ``"shuffle"``: shuffled passes over the population; each pass is a fresh random permutation
  cut into cohorts of m, so every client participates once per pass. When N is not a multiple of
  m a cohort takes the tail of one permutation and the head of the next (never the same id twice).
* ``"poisson"``: each id joins independently with probability m / N (variable cohort size).

Secret by default: without a ``seed`` the sampler's :class:`numpy.random.Generator` is seeded
with 128 bits of OS entropy (:mod:`secrets`), kept only inside the generator, never logged and
never in ``state_dict``: nobody holding the logs or a checkpoint can replay the cohorts, which
an amplified (subsampled) claim assumes are secret. A resumed secret sampler draws from a fresh
entropy-seeded generator: for ``"uniform"`` and ``"poisson"`` the rounds are i.i.d., so the
resumed run samples from the same law as an uninterrupted one; ``"shuffle"`` starts a fresh
pass (the interrupted pass's remaining order is secret and is not saved).

Reproducible mode (tests, debugging): an explicit integer ``seed``; ``state_dict`` /
``load_state_dict`` then restore the generator exactly, so a resumed run samples the same
cohorts as an uninterrupted one, and :func:`sampling_mark` says so in what the run logs.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np

from audit_callbacks.validation import check_choice, check_count, check_seed

__all__ = ["SAMPLING_RULES", "SECRET_SAMPLING", "CohortSampler", "sampling_mark"]

SAMPLING_RULES = ("uniform", "shuffle", "poisson")

#: What a run with secret sampling logs about its batches or cohorts.
SECRET_SAMPLING = "secret: drawn from OS entropy, never logged or checkpointed"


def sampling_mark(seed: int | None) -> str:
    """The line a run logs about its sampling (batches or cohorts): :data:`SECRET_SAMPLING`
    without a seed, else ``"reproducible from seed N: the claim assumes secret batches and does
    not hold for anyone holding the logs"``."""
    if seed is None:
        return SECRET_SAMPLING
    return (f"reproducible from seed {int(seed)}: the claim assumes secret batches and does not "
            "hold for anyone holding the logs")


def entropy_seed() -> int:
    """128 bits of OS entropy, for a generator whose seed is never written anywhere."""
    return secrets.randbits(128)


def _plain(obj: Any) -> Any:
    """numpy scalars to Python ones, so checkpoints load with ``weights_only=True``."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


class CohortSampler:
    """Samples the cohort of each round.

    Args:
        population: N, the number of client ids (real and virtual).
        cohort_size: m, the (expected, for Poisson) number of clients per round; 1 <= m <= N.
        rule: one of ``"uniform"``, ``"shuffle"``, ``"poisson"``.
        seed: None (default): secret sampling, the generator seeded from OS entropy and never
            saved; an integer >= 0: reproducible sampling from that seed (its state is saved
            by :meth:`state_dict`).

    Raises:
        ValueError: naming the argument: an unknown ``rule``; ``population`` not an integer >= 0,
            ``cohort_size`` not one >= 1, ``seed`` not None or one >= 0; a cohort larger than
            the population.
    """

    def __init__(self, population: int, cohort_size: int, rule: str = "uniform", seed: int | None = None):
        rule = check_choice(rule, "rule", SAMPLING_RULES)
        cohort_size = check_count(cohort_size, "cohort_size", minimum=1)
        population = check_count(population, "population")
        seed = None if seed is None else check_seed(seed)
        if population < cohort_size:
            raise ValueError(
                f"the population ({population} clients, canaries included) is smaller than the "
                f"cohort ({cohort_size} clients per round): lower clients_per_round or add clients"
            )
        self.population = population
        self.cohort_size = cohort_size
        self.rule = rule
        self.seed = seed
        self._rng = np.random.default_rng(entropy_seed() if seed is None else seed)
        self._queue: list[int] = []

    @property
    def reproducible(self) -> bool:
        """True when the cohorts follow from a seed (and :meth:`state_dict` holds the generator)."""
        return self.seed is not None

    @property
    def sampling_rate(self) -> float:
        """q = m / N, the per-round inclusion probability of any one client."""
        return self.cohort_size / self.population

    def sample(self) -> np.ndarray:
        """The next cohort: a sorted int64 array of distinct client ids."""
        if self.rule == "uniform":
            ids = self._rng.choice(self.population, size=self.cohort_size, replace=False)
        elif self.rule == "poisson":
            ids = np.flatnonzero(self._rng.random(self.population) < self.sampling_rate)
        else:
            ids = self._next_shuffled()
        return np.sort(np.asarray(ids, dtype=np.int64))

    def _next_shuffled(self) -> np.ndarray:
        chosen: list[int] = []
        deferred: list[int] = []
        seen: set[int] = set()
        while len(chosen) < self.cohort_size:
            if not self._queue:
                self._queue = self._rng.permutation(self.population).tolist()[::-1]
            cid = self._queue.pop()
            if cid in seen:  # only possible across a permutation boundary
                deferred.append(cid)
                continue
            seen.add(cid)
            chosen.append(cid)
        self._queue.extend(reversed(deferred))
        return np.asarray(chosen, dtype=np.int64)

    def state_dict(self) -> dict[str, Any]:
        """The sampler's settings, plus, only in reproducible mode, its generator and the rest of
        the current shuffled pass (a secret sampler's state would predict the next cohorts)."""
        state: dict[str, Any] = {
            "population": self.population,
            "cohort_size": self.cohort_size,
            "rule": self.rule,
        }
        if self.reproducible:
            state["rng"] = _plain(self._rng.bit_generator.state)
            state["queue"] = list(self._queue)
        return state

    def load_state_dict(self, state: dict[str, Any], *, settings: dict[str, str] | None = None) -> None:
        """Check the settings against this sampler's; restore the generator where both the state
        and this sampler are reproducible (a secret sampler keeps its fresh generator).

        Args:
            state: :meth:`state_dict`'s.
            settings: what sets each of ``population``, ``cohort_size`` and ``rule`` for the
                caller (e.g. ``{"cohort_size": "clients_per_round"}``), named in the refusal.

        Raises:
            ValueError: a setting differs, naming it, both values and the fix.
        """
        named = {"population": "population", "cohort_size": "cohort_size", "rule": "rule",
                 **(settings or {})}
        for key in ("rule", "cohort_size", "population"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"{named[key]}: the checkpoint's cohorts were sampled with {state[key]!r}, "
                    f"this run has {getattr(self, key)!r}: resuming would change the "
                    "sampling the privacy claim and the audit assume mid-run. Resume with the "
                    "checkpoint's settings, or start a new run"
                )
        if self.reproducible and "rng" in state:
            self._rng.bit_generator.state = state["rng"]
            self._queue = list(state["queue"])

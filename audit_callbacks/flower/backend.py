"""Canary clients inside a Flower (Message API) strategy: the backend of ``CanaryStrategy``.

**Sampling rule.** The wrapped strategy samples from the N connected nodes plus k virtual
canary nodes (its grid's ``get_node_ids()`` lists both), by its own rule; the canaries'
messages are kept on the server. With ``FedAvg``, the cohort is m = max(int((N + k) f),
min_train_nodes) nodes drawn uniformly without replacement, so each client joins a round with
probability q = m / (N + k). Set the DP wrapper's ``num_sampled_clients`` to that m (a warning
says when it differs): its noise on the average is z C / num_sampled_clients.

**Faults.** A round aggregating n' < m replies (a node died; m the DP wrapper's
``num_sampled_clients``, for which its noise z C / m on the average was set) has the effective
noise multiplier z n' / m; the analytic epsilon composes each canary's rounds at their
effective z (Dong, Roth, Su 2022: mu = sqrt(sum_t z_t^-2)) and the summary's
``epsilon_analytic_status`` names those rounds. A reply whose ``num-examples`` is NaN, inf or
negative is dropped (logged; the round goes on with the others). Replies of unequal weights
are flagged: every ``ok`` estimate's status becomes ``flagged: ...`` (DP-FedAvg's analysis
assumes equal weights). Waiting for the real nodes ends after ``node_timeout`` seconds with a
``TimeoutError``.

**Bad input.** A reply that is not model weights (other keys, shapes or dtypes, NaN or inf)
becomes an error reply (code :data:`BAD_REPLY_CODE`), i.e. one of the round's Flower
``failures``; a round with no valid real reply inserts no canary; a round the wrapped strategy
does not aggregate counts no participation and folds nothing. Every skip is logged on the
``flwr`` logger, never raised into the server app; no estimate is ever NaN.

Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning" (ICLR 2024),
§3: the canary clients are virtual: the server creates their updates, sampled like real
clients by the wrapped strategy (its grid lists real and canary nodes). A sampled canary
client j replies with the model theta_{t-1} + M C c_j (M the config's
``canary_norm_multiplier``, default 10), clipped by the same code as the real replies
(:func:`~audit_callbacks.flower.replies.clipping_path`): correct clipping makes its update
C c_j in the sum before the server's noise; a clipping at another norm shows in the
estimates. At each aggregated round the backend releases the model delta,
with the canaries that took part, to the :class:`~audit_callbacks.auditing.CanaryAuditor`.
The sampling rule and what is observed are in ``docs/methods/flower.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies

from audit_callbacks import names
from audit_callbacks.backends.base import BackendBase
from audit_callbacks.backends.fedavg import crowding_warning
from audit_callbacks.canary.base import NoisyAverageDelta, NoMatchedStatistic, ReleaseModel
from audit_callbacks.estimators import gaussian_epsilon
from audit_callbacks.flower.records import LOGGER, Layout
from audit_callbacks.flower.replies import (
    clip_canary_replies,
    clip_update,
    clipping_path,
    reply_weight,
)
from audit_callbacks.validation import check_real

__all__ = ["BAD_REPLY_CODE", "FlowerBackend", "find_attribute"]

#: ``Error.code`` of the error reply that replaces a reply that is not model weights.
BAD_REPLY_CODE = 17_001


def find_attribute(strategy: Any, name: str) -> Any:
    """``name`` of the first strategy in the wrapper chain (``.strategy`` links) that has it."""
    seen = 0
    while strategy is not None and seen < 16:
        if hasattr(strategy, name):
            return getattr(strategy, name)
        strategy, seen = getattr(strategy, "strategy", None), seen + 1
    return None


class _CanaryGrid(Grid):
    """The server's grid, whose node list also holds the canary clients' virtual node ids
    (negative, so never a real node's). Everything else is the real grid's."""

    def __init__(self, grid: Grid, virtual: list[int]) -> None:
        self._grid = grid
        self._virtual = virtual

    def set_run(self, run: Any) -> None:
        self._grid.set_run(run)

    @property
    def run(self) -> Any:
        return self._grid.run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self._grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return [*self._grid.get_node_ids(), *self._virtual]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None
                         ) -> Iterable[Message]:
        return self._grid.send_and_receive(messages, timeout=timeout)


class FlowerBackend(BackendBase):
    """Canary clients of a Flower strategy.

    Args:
        strategy: the wrapped strategy (FedAvg, or a DP wrapper around it).
        arrays: the first round's global model (its layout fixes d).
        population: N, the connected real nodes at the first round (caps the default k).
        noise_multiplier: z of the central Gaussian noise (0: none).
        clip_norm: C > 0.
        warn: ``warn(key, message)``, once per key.
        node_timeout: seconds to wait for the strategy's ``min_available_nodes`` real nodes
            before each round.

    Attributes:
        theta: the last released global model, flat ``[d]`` float32.
        theta_prev: the model the current round started from, flat ``[d]``.
        rounds: rounds whose release was folded or skipped (a resumed run's add to the
            restored ones).
        last_inserted: the canaries inserted in the last aggregated round.
        round_events: round (as ``short_rounds``: a resumed run's after the restored ones) -> what
            the audit did with it.
        short_rounds: round (a resumed run's after the restored ones) -> ``(replies,
            num_sampled_clients)`` of the released rounds that aggregated fewer replies than
            the DP wrapper's noise was set for.
        weight_rounds: round (as ``short_rounds``) -> the largest real weight over the round's mean weight,
            for rounds whose real replies reported unequal weights.
        inverse_variance: ``[k]`` float64, sum over each canary's released rounds of
            ``z_eff^-2`` (its GDP mu is the square root).
        wrapper_seconds: seconds spent in the wrapper (not in the wrapped strategy), per
            server round.
    """

    training = "DP-FedAvg (Flower)"
    sign = 1.0
    default_delta = 1e-6

    def __init__(self, strategy: Any, arrays: ArrayRecord, population: int, noise_multiplier: float,
                 clip_norm: float, warn: Callable[[str, str], None], *,
                 node_timeout: float = 600.0) -> None:
        self.layout = Layout.of(arrays)
        super().__init__(self.layout.dim, int(population))
        self.strategy = strategy
        self.noise_multiplier = float(noise_multiplier)
        self.clip_norm = float(clip_norm)
        self.warn = warn
        self.theta: torch.Tensor | None = None
        self.theta_prev: torch.Tensor | None = None
        self.rounds = 0
        self.offset = 0
        self.last_inserted: list[int] = []
        self.round_events: dict[int, str] = {}
        self.inputs: dict[str, Any] = {}
        self.wrapper_seconds: dict[int, float] = {}
        self._inner = 0.0
        self.released: ArrayRecord | None = None
        self._virtual: list[int] = []
        self._pending: dict[int, list[tuple[int, Message]]] = {}
        self._prev_arrays: ArrayRecord | None = None
        self.node_timeout = float(node_timeout)
        self.path, self.dp_wrapper, self.path_reason = clipping_path(strategy)
        self.short_rounds: dict[int, tuple[int, int]] = {}
        self.weight_rounds: dict[int, float] = {}
        self.inverse_variance = np.zeros(0, dtype=np.float64)

    @staticmethod
    def noise_and_clip(strategy: Any, noise_multiplier: float | None, clip_norm: float | None
                       ) -> tuple[float, float]:
        """z >= 0 and C > 0: those given, else the DP wrapper's in the wrapped strategy.

        Raises:
            ValueError: a bad value (naming it), or none given and no DP wrapper found.
        """
        z = find_attribute(strategy, "noise_multiplier") if noise_multiplier is None else noise_multiplier
        c = find_attribute(strategy, "clipping_norm") if clip_norm is None else clip_norm
        if z is None or c is None:
            raise ValueError("CanaryStrategy: no noise_multiplier / clip_norm given and no DP "
                             "wrapper (e.g. DifferentialPrivacyServerSideFixedClipping) found "
                             "in the wrapped strategy; pass noise_multiplier= and clip_norm=")
        return (check_real(z, "noise_multiplier", low=0.0),
                check_real(c, "clip_norm", low=0.0, low_inclusive=False))

    @classmethod
    def connect(cls, strategy: Any, grid: Grid, arrays: ArrayRecord, noise_multiplier: float,
                clip_norm: float, warn: Callable[[str, str], None], node_timeout: float = 600.0
                ) -> FlowerBackend:
        """The backend of a run's first round: waits (at most ``node_timeout`` seconds) for the
        real nodes (:meth:`wait_for_nodes`), then counts them as the real population."""
        population = cls.wait_for_nodes(strategy, grid, node_timeout)
        return cls(strategy, arrays, population, noise_multiplier, clip_norm, warn,
                   node_timeout=node_timeout)

    @staticmethod
    def wait_for_nodes(strategy: Any, grid: Grid, timeout: float = 600.0) -> int:
        """Wait for the strategy's ``min_available_nodes`` real nodes; returns how many are
        connected.

        Raises:
            TimeoutError: fewer are connected after ``timeout`` seconds (e.g. the SuperLink
                restarted and lost its nodes).
        """
        need = int(find_attribute(strategy, "min_available_nodes") or 1)
        end = time.monotonic() + timeout
        while len(real := list(grid.get_node_ids())) < need:
            if (left := end - time.monotonic()) <= 0:
                raise TimeoutError(
                    f"CanaryStrategy: {len(real)} node(s) connected after waiting {timeout:g} s, "
                    f"the wrapped strategy needs min_available_nodes={need}: are the SuperLink "
                    "and the SuperNodes up? (raise node_timeout= to wait longer)")
            LOGGER.log(INFO, "CanaryStrategy: waiting for nodes: %d connected (minimum %d)",
                       len(real), need)
            time.sleep(min(1.0, left))
        return len(real)

    def attach(self, auditor: Any) -> None:
        """Give the canaries virtual node ids, and check the DP wrapper's cohort size."""
        super().attach(auditor)
        k, n_real = auditor.num_canaries, int(self.population or 0)
        self._virtual = [-(j + 1) for j in range(k)]
        self.inverse_variance = np.zeros(k, dtype=np.float64)
        inputs: dict[str, Any] = {"clip_norm": self.clip_norm, "num_real_clients": n_real,
                                  "canary_norm_multiplier": auditor.config.canary_norm_multiplier,
                                  "canary_clipping": self.path_reason,
                                  "sampling": "the wrapped strategy's, over real and canary nodes",
                                  "strategy": repr(self.strategy)}
        fraction = find_attribute(self.strategy, "fraction_train")
        if isinstance(fraction, (int, float)):
            m = max(int((n_real + k) * fraction), int(find_attribute(self.strategy, "min_train_nodes") or 0))
            inputs.update(clients_per_round=m, sample_rate=m / (n_real + k))
            sampled = find_attribute(self.strategy, "num_sampled_clients")
            if sampled is not None and int(sampled) != m:
                self.warn("cohort", f"CanaryStrategy: the cohort is {m} of {n_real} real + {k} "
                          f"canary clients, but the DP wrapper's num_sampled_clients is "
                          f"{sampled}: its noise on the sum of the cohort's updates is "
                          f"z C {m}/{sampled}, not z C; set num_sampled_clients={m}")
            if m >= 1 and (alone := _canaries_only(m, n_real, k)) >= 0.01:
                self.warn("small_cohort", f"CanaryStrategy: the cohort of {m} nodes (fraction_train="
                          f"{fraction:g} of {n_real} real + {k} canary nodes, min_train_nodes="
                          f"{find_attribute(self.strategy, 'min_train_nodes')}) is so small that "
                          f"canaries alone fill it in {alone:.0%} of the rounds: those rounds train "
                          "nothing and insert no canary; raise fraction_train or min_train_nodes")
            # the cohort is fraction_train x (N + k): no cohort size to suggest, only fewer canaries
            crowded = crowding_warning(k, n_real, None, name="CanaryStrategy")
            if crowded:
                self.warn("crowding", crowded)
            LOGGER.log(INFO, "CanaryStrategy: %d canary clients join %d real ones; cohort %d, "
                       "rate q = %.4f per round", k, n_real, m, m / (n_real + k))
        if self.path == "audit":
            LOGGER.log(INFO, "CanaryStrategy: %s", self.path_reason)
        self.inputs = inputs

    def release_model(self, kind: str) -> ReleaseModel:
        """A round's release: the released model's delta, FedAvg's average plus the DP
        wrapper's noise (server learning rate 1, no momentum), or why no matched statistic
        applies."""
        m = find_attribute(self.strategy, "num_sampled_clients")
        if self.noise_multiplier <= 0:
            return NoMatchedStatistic("no DP noise (noise_multiplier = 0): the known-rounds statistic is undefined")
        if m is None:
            return NoMatchedStatistic("no DP wrapper's num_sampled_clients: the noisy sum's divisor is unknown")
        for name in ("server_momentum", "beta_1", "eta"):
            if find_attribute(self.strategy, name):
                return NoMatchedStatistic(f"the wrapped strategy has a server optimizer ({name}): its "
                                          "noisy aggregate cannot be recovered from the released models")
        floating = tuple((key, int(np.prod(shape, dtype=np.int64))) for key, shape, dtype in self.layout.entries
                         if np.issubdtype(np.dtype(dtype), np.floating))
        return NoisyAverageDelta(clip_norm=self.clip_norm, divisor=int(m),
                                 noise_multiplier=self.noise_multiplier, tensors=floating,
                                 extra_tensors=self.layout.integer_entries())

    # ------------------------------------------------------------------ a round
    def _tick(self, server_round: int, since: float, inner: float = 0.0) -> None:
        spent = time.perf_counter() - since - inner
        self.wrapper_seconds[server_round] = self.wrapper_seconds.get(server_round, 0.0) + spent

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        """Sample through the wrapped strategy over real + canary nodes; return the real
        nodes' messages and keep the canaries'.

        Raises:
            ValueError: ``arrays`` is not a model of the first round's layout.
        """
        start = time.perf_counter()
        why = self.layout.mismatch(arrays)
        if why is not None:
            raise ValueError(f"CanaryStrategy: the global model of round {server_round}: {why}")
        self.theta_prev = self.layout.flatten(arrays)
        self._integers_prev = self.layout.flatten_integer(arrays)
        self._prev_arrays = arrays
        if self.theta is None:
            self.theta = self.theta_prev
        if server_round > 1:  # the first round waited in CanaryStrategy.configure_train
            self.wait_for_nodes(self.strategy, grid, self.node_timeout)
        real, canary = [], []
        t_inner = time.perf_counter()
        messages = list(self.strategy.configure_train(server_round, arrays, config,
                                                      _CanaryGrid(grid, self._virtual)))
        inner = time.perf_counter() - t_inner
        for msg in messages:
            dst = int(msg.metadata.dst_node_id)
            (canary.append((-dst - 1, msg)) if dst < 0 else real.append(msg))
        self._pending[server_round] = canary
        self._tick(server_round, start, inner)
        return real

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None, bool]:
        """Check the real replies, add the canary clients' replies, aggregate through the
        wrapped strategy, and release the model delta to the auditor.

        Returns:
            ``(arrays, metrics, released)``: the wrapped strategy's result, and whether the
            audit folded a release this round.
        """
        start = time.perf_counter()
        result = self._aggregate(server_round, list(replies))
        self._tick(server_round, start, self._inner)
        return result

    def _aggregate(self, server_round: int, replies: list[Message]
                   ) -> tuple[ArrayRecord | None, MetricRecord | None, bool]:
        assert self.auditor is not None
        pending = self._pending.pop(server_round, [])
        self._inner = 0.0
        if self.theta_prev is None:  # configure_train was not ours
            return (*self._inner_aggregate(server_round, replies), False)
        checked: list[Message] = []
        key = find_attribute(self.strategy, "weighted_by_key") or "num-examples"
        dropped = 0
        for msg in replies:
            why = None if msg.has_error() else self._reply_problem(msg)
            if why is not None:
                LOGGER.log(WARNING, "CanaryStrategy: round %d: the reply of node %s is not model "
                           "weights (%s); counted as a failure", server_round,
                           msg.metadata.src_node_id, why)
                msg = Message(error=Error(code=BAD_REPLY_CODE, reason=why), metadata=msg.metadata)
            elif not msg.has_error() and (bad := reply_weight(msg, key)[1]) is not None:
                LOGGER.log(WARNING, "CanaryStrategy: round %d: the reply of node %s has %s; it "
                           "is skipped (the round aggregates the others)", server_round,
                           msg.metadata.src_node_id, bad)
                dropped += 1
                continue
            checked.append(msg)
        valid = [m for m in checked if not m.has_error()]
        failures = len(checked) - len(valid)
        rnd = self.offset + server_round  # the audit's round (a resumed run's count on)
        self._check_weights(rnd, valid, key)
        inserted: list[int] = []
        if pending and not valid:
            self.round_events[rnd] = "no real reply: canaries not inserted"
            self.warn("no_real", f"CanaryStrategy: round {rnd}: no valid real reply ({failures} "
                      f"failures); the {len(pending)} sampled canary clients are not inserted "
                      "(warned once: every such round is in the summary's round_events)")
        elif pending:
            try:
                checked.extend(self._canary_replies(pending, valid))
                inserted = [j for j, _ in pending]
            except ValueError as err:  # the clients' clipping mod refused the canaries
                self.round_events[rnd] = f"canaries not inserted: {err}"
                LOGGER.log(WARNING, "CanaryStrategy: round %d: %s; the canaries are not "
                           "inserted", server_round, err)
        self.last_inserted = inserted
        sampled = find_attribute(self.strategy, "num_sampled_clients")
        if sampled is not None and valid and len(valid) + len(inserted) != int(sampled):
            self.warn("count", f"CanaryStrategy: round {server_round}: {len(valid)} real and "
                      f"{len(inserted)} canary replies, the DP wrapper expects {sampled}")
        try:
            arrays, metrics = self._inner_aggregate(server_round, checked)
        except (InconsistentMessageReplies, ZeroDivisionError) as err:
            # ZeroDivisionError: flwr 1.41's fixed clipping divides by the norm of a client's
            # update, so a client that returns the model unchanged stops its server app
            LOGGER.log(WARNING, "CanaryStrategy: round %d: the wrapped strategy could not "
                       "aggregate the replies (%s: %s); the round is skipped", server_round,
                       type(err).__name__, err)
            arrays, metrics = None, None
        self.rounds = rnd
        if dropped:
            self.round_events[rnd] = f"{dropped} replies skipped: bad {key}"
        if arrays is None:
            self.round_events.setdefault(rnd, f"not aggregated ({failures} failures)")
            self.warn("not_aggregated", f"CanaryStrategy: round {rnd} was not aggregated "
                      f"({failures} failures); the audit counts no canary participation and "
                      "folds nothing (warned once: every such round is in the summary's "
                      "round_events)")
            return arrays, metrics, False
        if (why := self.layout.mismatch(arrays)) is not None:
            self.round_events[rnd] = f"released model skipped: {why}"
            self.auditor.skip_release(f"the aggregated model of round {server_round} ({why})")
            return arrays, metrics, False
        theta = self.layout.flatten(arrays)
        participants = np.asarray(inserted, dtype=np.int64)
        self._effective_noise(rnd, len(valid) + len(inserted), participants)
        integers = self.layout.flatten_integer(arrays)
        self.auditor.release(theta - self.theta_prev, participants, what=f"round {server_round}",
                             extras=(integers - self._integers_prev).float() if integers.numel() else None)
        self.theta, self.released = theta, arrays
        self.round_events.setdefault(rnd, f"folded ({len(inserted)} canaries, "
                                     f"{failures} failures)")
        return arrays, metrics, True

    def _check_weights(self, server_round: int, valid: list[Message], key: str) -> None:
        """Flag the round when its real replies report unequal weights ``key``."""
        weights = [w for w in (reply_weight(m, key)[0] for m in valid) if w is not None]
        if len(weights) > 1 and max(weights) > min(weights) * (1 + 1e-9):
            self.weight_rounds[server_round] = max(weights) / float(np.mean(weights))
            self.warn("weights", f"CanaryStrategy: the real clients report unequal {key!r} "
                      f"(round {server_round}: the largest is {self.weight_rounds[server_round]:.3g}"
                      "x the mean); DP-FedAvg's noise calibration and the canaries' analysis "
                      "assume equal weights: the estimates are flagged (canaries get the mean weight)")

    def _effective_noise(self, server_round: int, replies: int, participants: np.ndarray) -> None:
        """Compose the round's effective noise multiplier z_eff = z min(replies, m) / m into
        the participants' inverse variances (m: the DP wrapper's num_sampled_clients)."""
        if self.noise_multiplier <= 0:
            return
        m = find_attribute(self.strategy, "num_sampled_clients")
        z_eff = self.noise_multiplier
        if m is not None and 0 < replies < int(m):
            self.short_rounds[server_round] = (replies, int(m))
            z_eff = self.noise_multiplier * replies / int(m)
            self.warn("short", f"CanaryStrategy: round {server_round} aggregated "
                      f"{replies} replies, the DP wrapper's noise is set for {m}: effective noise "
                      f"multiplier {z_eff:.4g} (not {self.noise_multiplier:g}); the analytic "
                      "epsilon uses it (warned once: every such round is in the summary's "
                      "short_rounds)")
        if participants.size:
            np.add.at(self.inverse_variance, participants, z_eff ** -2)

    def _inner_aggregate(self, server_round: int, replies: list[Message]
                         ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's aggregation, its time kept out of the wrapper's."""
        t = time.perf_counter()
        try:
            return self.strategy.aggregate_train(server_round, replies)
        finally:
            self._inner += time.perf_counter() - t

    def _canary_replies(self, pending: list[tuple[int, Message]], valid: list[Message]) -> list[Message]:
        """Replies of the sampled canary clients: base + M C c_j (clipped as the clipping path
        says), with the real replies' record names, the mean weight and the weighted mean
        metrics."""
        assert self.auditor is not None and self._prev_arrays is not None
        key = find_attribute(self.strategy, "weighted_by_key") or "num-examples"
        template = valid[0].content
        weights = [reply_weight(msg, key)[0] for msg in valid]
        wts = np.asarray([1.0 if w is None else w for w in weights], dtype=np.float64)
        norm = wts / wts.sum() if wts.sum() > 0 else np.full(wts.size, 1.0 / wts.size)
        metric_records = {}
        for name in template.metric_records.keys():
            rec = MetricRecord()
            for mkey, value in template[name].items():
                if mkey == key:
                    rec[mkey] = float(wts.mean())
                    continue
                vals = [m.content[name].get(mkey) for m in valid if name in m.content]
                if isinstance(value, list):
                    try:
                        rec[mkey] = [float(x) for x in np.tensordot(norm, np.asarray(vals, float), 1)]
                    except (ValueError, TypeError):
                        rec[mkey] = value
                elif all(isinstance(v, (int, float)) for v in vals) and len(vals) == len(valid):
                    rec[mkey] = float(np.dot(norm, np.asarray(vals, dtype=np.float64)))
                else:
                    rec[mkey] = value
            metric_records[name] = rec
        scale = float(self.auditor.config.canary_norm_multiplier) * self.clip_norm
        updates = self.auditor.canaries.batch([j for j, _ in pending], scale=scale)
        if self.path == "audit":  # nothing clips the real replies: Flower's clipping at C
            updates = torch.from_numpy(clip_update(updates.numpy(), self.clip_norm))
        out = []
        records = self.layout.add_rows(self._prev_arrays, updates)
        for record, (_, instruction) in zip(records, pending, strict=True):
            content = RecordDict({name: record for name in template.array_records.keys()})
            for name, rec in metric_records.items():
                content[name] = rec
            for name, cfg in template.config_records.items():
                content[name] = cfg
            out.append(Message(content, reply_to=instruction))
        if self.path == "client":  # the clients' own clipping mod, at the norm they are told
            out = clip_canary_replies([(r, i) for r, (_, i) in zip(out, pending, strict=True)],
                                      self.dp_wrapper)
        return out

    def _reply_problem(self, msg: Message) -> str | None:
        content = msg.content
        if not content.array_records:
            return "the reply has no ArrayRecord (model weights)"
        for name, record in content.array_records.items():
            why = self.layout.mismatch(record)
            if why is not None:
                return f"ArrayRecord {name!r}: {why}"
        return None

    def check_evaluated(self, arrays: ArrayRecord) -> None:
        """Warn once when the model evaluated is not the one released (something outside
        the wrapper changes the aggregate)."""
        if self.released is not None and arrays is not self.released and (
            self.layout.mismatch(arrays) is not None
            or not torch.equal(self.layout.flatten(arrays), self.layout.flatten(self.released))
        ):
            self.warn("outer", "CanaryStrategy: the model evaluated is not the one this "
                      "wrapper released: something outside it changes the aggregate (wrap the "
                      "DP wrapper with CanaryStrategy, not the other way round)")

    # ------------------------------------------------------------------ what the auditor asks
    def flat_parameters(self) -> torch.Tensor | None:
        return self.theta

    def progress(self) -> int:
        return self.rounds

    def claim(self, delta: float) -> dict[str, Any]:
        """The analytic epsilon assumes known rounds: it holds whoever knows the cohorts."""
        return {"claim_sampling": "known rounds: the analytic epsilon assumes the adversary knows "
                                  "every round each canary took part in (no amplification by "
                                  "sampling), so it holds whether or not the strategy's cohorts "
                                  "are secret"}

    def analytic(self, delta: float) -> dict[str, float | None]:
        """The Gaussian mechanism composed over the most-sampled canary's rounds, if the
        adversary knows them: sqrt(r)/z-GDP (Dong, Roth, Su 2022); ``inf`` without noise."""
        assert self.auditor is not None
        max_part = int(self.auditor.participations.max(initial=0))
        if self.noise_multiplier <= 0:
            return {names.EPSILON_ANALYTIC: math.inf}
        if max_part < 1:
            return {names.EPSILON_ANALYTIC: 0.0}
        if not self.short_rounds:
            return {names.EPSILON_ANALYTIC: gaussian_epsilon(self.noise_multiplier, delta, compositions=max_part)}
        mu = math.sqrt(float(self.inverse_variance.max()))  # each canary's rounds at their z_eff
        return {names.EPSILON_ANALYTIC: gaussian_epsilon(1.0, delta, sensitivity=mu)}

    def estimate_flag(self) -> str | None:
        """Why every estimate is flagged (unequal client weights), or None."""
        if not self.weight_rounds:
            return None
        worst = max(self.weight_rounds, key=self.weight_rounds.__getitem__)
        return (f"unequal client weights in rounds {_rounds(self.weight_rounds)} (largest "
                f"{self.weight_rounds[worst]:.3g}x the round's mean, round {worst}); DP-FedAvg "
                "and the canaries' analysis assume equal weights")

    def summary_status(self) -> dict[str, str]:
        """The summary's ``epsilon_analytic_status`` when rounds aggregated fewer replies than
        the noise was set for (else nothing)."""
        if not self.short_rounds:
            return {}
        worst = min(r / m for r, m in self.short_rounds.values())
        return {"epsilon_analytic_status": (
            f"ok: effective noise multiplier in rounds {_rounds(self.short_rounds)}, which "
            "aggregated fewer replies than the DP wrapper's num_sampled_clients (z_eff = z "
            f"replies / num_sampled_clients, down to {self.noise_multiplier * worst:.4g}); each "
            "canary's rounds composed at their z_eff")}

    def summary_inputs(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "noise_multiplier": self.noise_multiplier, **self.inputs,
                "round_events": {str(k): v for k, v in self.round_events.items()},
                "short_rounds": {str(k): {"replies": r, "num_sampled_clients": m,
                                          "noise_multiplier_effective": self.noise_multiplier * r / m}
                                 for k, (r, m) in self.short_rounds.items()},
                "unequal_weight_rounds": {str(k): v for k, v in self.weight_rounds.items()}}

    def state_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "theta": None if self.theta is None else self.theta.clone(),
                "layout": [list(e) for e in self.layout.entries],
                "round_events": dict(self.round_events),
                "short_rounds": {k: list(v) for k, v in self.short_rounds.items()},
                "weight_rounds": dict(self.weight_rounds),
                "inverse_variance": self.inverse_variance.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a resumed run's rounds add to the restored ones.

        Raises:
            ValueError: the state's model layout differs from this run's.
        """
        layout = tuple((k, tuple(s), d) for k, s, d in state["layout"])
        if layout != self.layout.entries:
            raise ValueError("CanaryStrategy: the checkpointed model's arrays differ from this run's")
        theta = state.get("theta")
        if theta is not None and tuple(theta.shape) != (self.dim,):
            raise ValueError(f"checkpointed theta has shape {tuple(theta.shape)}, expected ({self.dim},)")
        self.rounds = self.offset = int(state["rounds"])
        self.theta = None if theta is None else torch.as_tensor(theta, dtype=torch.float32).clone()
        self.round_events = {int(k): v for k, v in state.get("round_events", {}).items()}
        self.short_rounds = {int(k): (int(v[0]), int(v[1]))
                             for k, v in state.get("short_rounds", {}).items()}
        self.weight_rounds = {int(k): float(v) for k, v in state.get("weight_rounds", {}).items()}
        inv = state.get("inverse_variance")
        if inv is None and self.auditor is not None and self.noise_multiplier > 0:
            # a state from before effective noise was kept: every restored round at z
            inv = self.auditor.participations / self.noise_multiplier ** 2
        if inv is not None:
            inv = np.asarray(inv, dtype=np.float64)
            if inv.shape != self.inverse_variance.shape:
                raise ValueError(f"checkpointed inverse_variance covers {inv.size} canaries, "
                                 f"this run has {self.inverse_variance.size}")
            self.inverse_variance = inv.copy()


def _canaries_only(m: int, n_real: int, k: int) -> float:
    """The chance that a cohort of ``m`` nodes drawn uniformly without replacement from
    ``n_real`` real and ``k`` canary nodes holds no real node: C(k, m) / C(n_real + k, m)."""
    if m > k:
        return 0.0
    return math.exp(math.lgamma(k + 1) - math.lgamma(k - m + 1) - math.lgamma(n_real + k + 1)
                    + math.lgamma(n_real + k - m + 1))


def _rounds(rounds: dict[int, Any]) -> str:
    """Server rounds as the summary names them: ``[3, 4, 5]`` (the first 20, then a count)."""
    keys = sorted(rounds)
    return str(keys) if len(keys) <= 20 else f"{keys[:20]} and {len(keys) - 20} more"

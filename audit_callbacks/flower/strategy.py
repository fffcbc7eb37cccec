"""``CanaryStrategy``: canary clients in a Flower (Message API) strategy, and their audit.

Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning" (ICLR 2024),
Alg. 2 (final model) and Alg. 3 (all iterates), §3: the canary clients are virtual: the server
creates their updates, sampled like real clients. The formulas are in
``docs/methods/canaries.md``; the sampling rule and what is observed in ``docs/methods/flower.md``.
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
from flwr.serverapp.strategy import Strategy

from audit_callbacks.backends.base import CanaryConfig
from audit_callbacks.callbacks.summary import write_summary
from audit_callbacks.canaries import KINDS
from audit_callbacks.estimators.canary_report import CanaryReport
from audit_callbacks.flower._audit import LOGGER, FlowerBackend, Reporter
from audit_callbacks.flower.records import Layout, flower_versions

__all__ = ["CanaryStrategy", "BAD_REPLY_CODE"]

#: ``Error.code`` of the error reply that replaces a reply that is not model weights.
BAD_REPLY_CODE = 17_001


def _find(strategy: Any, name: str) -> Any:
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


class CanaryStrategy(Strategy):
    """Wrap a FedAvg-style Flower strategy (Message API, ``flwr.serverapp.strategy``) to add
    canary clients and estimate epsilon from their cosines, as ``CanaryAudit`` does.

    Compose it OUTSIDE Flower's central-DP wrapper (which exists for the Message API in
    flwr 1.41: ``flwr.serverapp.strategy.DifferentialPrivacyServerSideFixedClipping`` and
    ``...ClientSideFixedClipping``)::

        dp = DifferentialPrivacyServerSideFixedClipping(FedAvg(fraction_train=f, ...), z, C, m)
        strategy = CanaryStrategy(dp, num_canaries=k, num_rounds=R)  # z and C read from dp

    **Sampling rule.** The wrapped strategy samples from the connected nodes plus k virtual
    canary nodes (its grid's ``get_node_ids()`` lists both), by its own rule; the canaries'
    messages are kept on the server. With ``FedAvg``, the cohort is m = max(int((N + k) f),
    min_train_nodes) nodes drawn uniformly without replacement from the N + k, so every real
    and canary client joins a round with probability q = m / (N + k), and a canary's
    participations over R rounds are Binomial(R, q). Set the DP wrapper's
    ``num_sampled_clients`` to that m (a warning says when it differs): its noise on the
    average is z C / num_sampled_clients, i.e. z C on the sum of the m replies.

    **Canary updates.** A sampled canary client j replies with the model theta_{t-1} + C c_j
    (C the clip norm, c_j a unit canary of :mod:`audit_callbacks.canaries`), so it passes the
    server-side clipping unchanged and its update C c_j enters the clipped sum before the
    noise; its weight is the mean weight (``weighted_by_key``) of the round's real replies, and
    its metrics are their weighted means (so the aggregated metrics are unchanged). DP-FedAvg's
    analysis assumes equal weights (e.g. every client reports ``num-examples`` 1): a warning
    says when they differ. With client-side clipping (``fixedclipping_mod``) the canaries are
    already of norm C. The strategy keeps every released model's delta theta_t - theta_{t-1}
    for the all-iterates statistic (Andrew et al. Alg. 3).

    **Bad input.** A reply that is not model weights (other keys, shapes or dtypes, NaN or inf)
    is replaced by an error reply (code :data:`BAD_REPLY_CODE`), i.e. counted among the
    round's Flower ``failures``; a round with no valid real reply inserts no canary; a round
    the wrapped strategy does not aggregate (e.g. the DP wrapper skips rounds with failures)
    counts no canary participation and folds nothing; inconsistent replies are logged and the
    round skipped. Every skip is logged on the ``flwr`` logger; no estimate is ever NaN.

    Args:
        strategy: the wrapped strategy (FedAvg, or a DP wrapper around it).
        num_canaries: k observed canary clients (default: min(1000, N real nodes)).
        num_unobserved: k' canaries never inserted (the empirical null; see ``CanaryAudit``).
        canaries: ``"hadamard"`` (default) or ``"gaussian"``.
        noise_multiplier: z; default: the DP wrapper's ``noise_multiplier``. 0: no noise.
        clip_norm: C > 0; default: the DP wrapper's ``clipping_norm``.
        num_rounds: the run's rounds; the final estimate (with bootstrap intervals) and the
            summary are made after round ``num_rounds`` (:meth:`start` sets it; otherwise call
            :meth:`finish`).
        every_n_rounds: estimate and log every n rounds (and at the end).
        delta: the delta of every epsilon.
        alpha: 1 - confidence of the lower bounds.
        bootstrap: resamples of the final estimates' intervals.
        seed: the canaries' seed (and of the bootstrap).
        log_dir: TensorBoard event files and the summary go here (None: neither).
        summary_filename: the summary JSON's name in ``log_dir``.
        log_histograms: also write the cosine histograms.

    Raises:
        ValueError: bad arguments (clip norm <= 0 or not finite, noise multiplier < 0), or no
            clip norm / noise multiplier given or found in the wrapped strategies.
    """

    def __init__(
        self,
        strategy: Strategy,
        num_canaries: int | None = None,
        num_unobserved: int | None = None,
        *,
        canaries: str = "hadamard",
        noise_multiplier: float | None = None,
        clip_norm: float | None = None,
        num_rounds: int | None = None,
        every_n_rounds: int = 1,
        delta: float = 1e-6,
        alpha: float = 0.05,
        bootstrap: int = 200,
        seed: int = 0,
        log_dir: str | None = "runs/flower_canary_audit",
        summary_filename: str = "audit_summary.json",
        log_histograms: bool = True,
    ) -> None:
        super().__init__()
        z = _find(strategy, "noise_multiplier") if noise_multiplier is None else noise_multiplier
        c = _find(strategy, "clipping_norm") if clip_norm is None else clip_norm
        if z is None or c is None:
            raise ValueError("CanaryStrategy: no noise_multiplier / clip_norm given and no DP "
                             "wrapper (e.g. DifferentialPrivacyServerSideFixedClipping) found "
                             "in the wrapped strategy; pass noise_multiplier= and clip_norm=")
        checks = {
            "clip_norm": isinstance(c, (int, float)) and math.isfinite(c) and c > 0,
            "noise_multiplier": isinstance(z, (int, float)) and math.isfinite(z) and z >= 0,
            "num_canaries": num_canaries is None or num_canaries >= 2,
            "num_unobserved": num_unobserved is None or num_unobserved >= 0,
            "canaries": canaries in KINDS,
            "num_rounds": num_rounds is None or num_rounds >= 1,
            "every_n_rounds": every_n_rounds >= 1,
            "delta": 0 < delta < 1,
            "alpha": 0 < alpha < 1,
            "bootstrap": bootstrap >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                value = {"clip_norm": c, "noise_multiplier": z}.get(name, locals().get(name))
                raise ValueError(f"CanaryStrategy: invalid {name}={value!r}")
        self.strategy = strategy
        self.config = CanaryConfig(num_canaries, num_unobserved, canaries, int(seed))
        self.noise_multiplier = float(z)
        self.clip_norm = float(c)
        self.num_rounds = num_rounds
        self.every_n_rounds = int(every_n_rounds)
        self.delta, self.alpha, self.bootstrap = float(delta), float(alpha), int(bootstrap)
        self.log_dir = log_dir
        self.summary_filename = summary_filename
        self.log_histograms = log_histograms
        self.backend: FlowerBackend | None = None
        self.reporter: Reporter | None = None
        self.layout: Layout | None = None
        self.last_report: CanaryReport | None = None
        self.summary_path: str | None = None
        #: seconds spent in this wrapper (not in the wrapped strategy), per server round
        self.wrapper_seconds: dict[int, float] = {}
        self.round_events: dict[int, str] = {}  # server round -> what the audit did with it
        self._virtual: list[int] = []
        self._pending: dict[int, list[tuple[int, Message]]] = {}
        self._prev: tuple[ArrayRecord, torch.Tensor] | None = None
        self._released: ArrayRecord | None = None
        self._pending_state: dict[str, Any] | None = None
        self._offset = 0  # rounds of a restored state: a resumed run's server rounds add to it
        self._finished_at = -1
        self._warned: set[str] = set()
        self._early: list[tuple[dict[str, float | None], int]] = []  # evaluations before round 1

    # ------------------------------------------------------------------ helpers
    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            LOGGER.log(WARNING, message)

    def _tick(self, server_round: int, since: float, inner: float = 0.0) -> None:
        spent = time.perf_counter() - since - inner
        self.wrapper_seconds[server_round] = self.wrapper_seconds.get(server_round, 0.0) + spent

    @property
    def participations(self) -> np.ndarray:
        """Rounds each observed canary took part in (released rounds only), ``[k]``."""
        return np.zeros(0, np.int64) if self.backend is None else self.backend.participations

    @property
    def sample_rate(self) -> float | None:
        """q = m / (N + k) of a FedAvg-style inner strategy (None before the first round)."""
        return None if self.backend is None else self.backend.inputs.get("sample_rate")

    def _setup(self, arrays: ArrayRecord, grid: Grid) -> float:
        """At the first round: wait for the strategy's minimum of real nodes, make the canaries
        for the model's d, and check the DP wrapper's cohort size. Returns the seconds waited."""
        need = int(_find(self.strategy, "min_available_nodes") or 1)
        waited = time.perf_counter()
        while len(real := list(grid.get_node_ids())) < need:
            LOGGER.log(INFO, "CanaryStrategy: waiting for nodes: %d connected (minimum %d)",
                       len(real), need)
            time.sleep(1)
        waited = time.perf_counter() - waited
        self.layout = Layout.of(arrays)
        backend = FlowerBackend(self.config, self._warn, self.layout.dim, len(real),
                                self.noise_multiplier)
        k, n_real = backend.num_canaries, len(real)
        self._virtual = [-(j + 1) for j in range(k)]
        fraction = _find(self.strategy, "fraction_train")
        inputs: dict[str, Any] = {"clip_norm": self.clip_norm, "num_real_clients": n_real,
                                  "sampling": "the wrapped strategy's, over real and canary "
                                              "nodes", "strategy": repr(self.strategy)}
        if isinstance(fraction, (int, float)):
            m = max(int((n_real + k) * fraction), int(_find(self.strategy, "min_train_nodes") or 0))
            inputs.update(clients_per_round=m, sample_rate=m / (n_real + k))
            sampled = _find(self.strategy, "num_sampled_clients")
            if sampled is not None and int(sampled) != m:
                self._warn("cohort", f"CanaryStrategy: the cohort is {m} of {n_real} real + {k} "
                           f"canary clients, but the DP wrapper's num_sampled_clients is "
                           f"{sampled}: its noise on the sum of the cohort's updates is "
                           f"z C {m}/{sampled}, not z C; set num_sampled_clients={m}")
            LOGGER.log(INFO, "CanaryStrategy: %d canary clients join %d real ones; cohort %d, "
                       "rate q = %.4f per round", k, n_real, m, m / (n_real + k))
        backend.inputs = inputs
        self.backend = backend
        self.reporter = Reporter(backend, delta=self.delta, alpha=self.alpha,
                                 seed=self.config.seed, log_dir=self.log_dir,
                                 log_histograms=self.log_histograms)
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            self._restore(state)
        if backend.stats.theta0 is None:
            backend.stats.set_initial(self.layout.flatten(arrays))
        return waited

    # ------------------------------------------------------------------ training
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
    ) -> Iterable[Message]:
        """Sample through the wrapped strategy over real + canary nodes; return the real
        nodes' messages and keep the canaries'.

        Raises:
            ValueError: ``arrays`` is not a model of the first round's layout.
        """
        start, waited = time.perf_counter(), 0.0
        if self.backend is None:
            waited = self._setup(arrays, grid)  # waiting for nodes is not the wrapper's cost
        assert self.layout is not None and self.backend is not None
        why = self.layout.mismatch(arrays)
        if why is not None:
            raise ValueError(f"CanaryStrategy: the global model of round {server_round}: {why}")
        theta = self.layout.flatten(arrays)
        self._prev = (arrays, theta)
        if self.backend.theta is None:
            self.backend.theta = theta
        t_inner = time.perf_counter()
        messages = list(self.strategy.configure_train(
            server_round, arrays, config, _CanaryGrid(grid, self._virtual)))
        inner = time.perf_counter() - t_inner + waited
        real, canary = [], []
        for msg in messages:
            dst = int(msg.metadata.dst_node_id)
            (canary.append((-dst - 1, msg)) if dst < 0 else real.append(msg))
        self._pending[server_round] = canary
        self._tick(server_round, start, inner)
        return real

    def _canary_replies(self, pending: list[tuple[int, Message]], valid: list[Message],
                        base: ArrayRecord) -> list[Message]:
        """Replies of the sampled canary clients: base + C c_j, with the real replies' record
        names, the mean weight and the weighted mean metrics."""
        assert self.backend is not None and self.layout is not None
        key = _find(self.strategy, "weighted_by_key") or "num-examples"
        template = valid[0].content
        metric_names = list(template.metric_records.keys())
        weights = []
        for msg in valid:
            metrics = next(iter(msg.content.metric_records.values()), None)
            w = None if metrics is None else metrics.get(key)
            weights.append(float(w) if isinstance(w, (int, float)) else 1.0)
        wts = np.asarray(weights, dtype=np.float64)
        if wts.size > 1 and not np.allclose(wts, wts[0]):
            self._warn("weights", f"CanaryStrategy: the real clients report unequal {key!r}; "
                       "DP-FedAvg's noise calibration and the canaries' analysis assume equal "
                       "weights (canaries get the mean weight)")
        norm = wts / wts.sum() if wts.sum() > 0 else np.full(wts.size, 1.0 / wts.size)
        metric_records = {}
        for name in metric_names:
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
        js = [j for j, _ in pending]
        updates = self.backend.stats.canaries.batch(js, scale=self.clip_norm)
        out = []
        records = self.layout.add_rows(base, updates)
        for record, (_, instruction) in zip(records, pending, strict=True):
            content = RecordDict({name: record for name in template.array_records.keys()})
            for name, rec in metric_records.items():
                content[name] = rec
            for name, cfg in template.config_records.items():
                content[name] = cfg
            out.append(Message(content, reply_to=instruction))
        return out

    def _reply_problem(self, msg: Message) -> str | None:
        assert self.layout is not None
        content = msg.content
        if not content.array_records:
            return "the reply has no ArrayRecord (model weights)"
        for name, record in content.array_records.items():
            why = self.layout.mismatch(record)
            if why is not None:
                return f"ArrayRecord {name!r}: {why}"
        return None

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message],
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check the real replies, add the canary clients' replies, aggregate through the
        wrapped strategy, and fold the released model's delta (see the class docstring)."""
        start, inner = time.perf_counter(), 0.0
        replies = list(replies)
        pending = self._pending.pop(server_round, [])
        if self.backend is None or self._prev is None:  # configure_train was not ours
            return self.strategy.aggregate_train(server_round, replies)
        checked: list[Message] = []
        for msg in replies:
            why = None if msg.has_error() else self._reply_problem(msg)
            if why is not None:
                LOGGER.log(WARNING, "CanaryStrategy: round %d: the reply of node %s is not model "
                           "weights (%s); counted as a failure", server_round,
                           msg.metadata.src_node_id, why)
                msg = Message(error=Error(code=BAD_REPLY_CODE, reason=why), metadata=msg.metadata)
            checked.append(msg)
        valid = [m for m in checked if not m.has_error()]
        failures = len(checked) - len(valid)
        inserted: list[int] = []
        if pending and not valid:
            self.round_events[server_round] = "no real reply: canaries not inserted"
            LOGGER.log(WARNING, "CanaryStrategy: round %d: no valid real reply (%d failures); "
                       "the %d sampled canary clients are not inserted", server_round, failures,
                       len(pending))
        elif pending:
            checked.extend(self._canary_replies(pending, valid, self._prev[0]))
            inserted = [j for j, _ in pending]
        sampled = _find(self.strategy, "num_sampled_clients")
        if sampled is not None and valid and len(valid) + len(inserted) != int(sampled):
            self._warn("count", f"CanaryStrategy: round {server_round}: {len(valid)} real and "
                       f"{len(inserted)} canary replies, the DP wrapper expects {sampled}")
        t_inner = time.perf_counter()
        try:
            arrays, metrics = self.strategy.aggregate_train(server_round, checked)
        except (InconsistentMessageReplies, ZeroDivisionError) as err:
            # ZeroDivisionError: flwr 1.41's fixed clipping divides by the norm of a client's
            # update, so a client that returns the model unchanged stops its server app
            LOGGER.log(WARNING, "CanaryStrategy: round %d: the wrapped strategy could not "
                       "aggregate the replies (%s: %s); the round is skipped", server_round,
                       type(err).__name__, err)
            arrays, metrics = None, None
        inner += time.perf_counter() - t_inner
        self.backend.rounds = self._offset + server_round
        if arrays is None:
            self.round_events.setdefault(server_round, f"not aggregated ({failures} failures)")
            LOGGER.log(WARNING, "CanaryStrategy: round %d was not aggregated (%d failures); the "
                       "audit counts no canary participation and folds nothing", server_round,
                       failures)
        elif (why := self.layout.mismatch(arrays)) is not None:
            self.round_events[server_round] = f"released model skipped: {why}"
            self.backend.stats.rounds_skipped += 1
            LOGGER.log(WARNING, "CanaryStrategy: round %d: the aggregated model is skipped by "
                       "the audit: %s", server_round, why)
        else:
            theta = self.layout.flatten(arrays)
            if inserted:
                np.add.at(self.backend.participations, np.asarray(inserted, dtype=np.int64), 1)
            self.backend.fold(theta - self._prev[1], f"round {server_round}")
            self.backend.theta = theta
            self._released = arrays
            self.round_events.setdefault(server_round, f"folded ({len(inserted)} canaries, "
                                         f"{failures} failures)")
            if self.backend.rounds % self.every_n_rounds == 0:
                self._report(bootstrap=0)
        self._tick(server_round, start, inner)
        return arrays, metrics

    # ------------------------------------------------------------------ evaluation
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
    ) -> Iterable[Message]:
        """Pass through; after round ``num_rounds``, the final estimate and the summary."""
        start = time.perf_counter()
        if self._released is not None and arrays is not self._released and self.layout and (
            self.layout.mismatch(arrays) is not None
            or not torch.equal(self.layout.flatten(arrays), self.layout.flatten(self._released))
        ):
            self._warn("outer", "CanaryStrategy: the model evaluated is not the one this "
                       "wrapper released: something outside it changes the aggregate (wrap the "
                       "DP wrapper with CanaryStrategy, not the other way round)")
        if self.num_rounds is not None and server_round == self.num_rounds:
            self.finish()
        self._tick(server_round, start)
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Pass through; the numeric metrics also go to TensorBoard as ``val_clients/<key>``."""
        metrics = self.strategy.aggregate_evaluate(server_round, replies)
        if metrics is not None and self.reporter is not None:
            self.reporter.scalars(_numeric(metrics, "val_clients/"), self._offset + server_round)
        return metrics

    def summary(self) -> None:
        """Log the canary settings, then the wrapped strategy's summary."""
        LOGGER.log(INFO, "\t├──> Canary audit (Andrew et al., ICLR 2024): %s canaries (%s), "
                   "z = %s, C = %s", self.config.num_canaries or "default",
                   self.config.kind, self.noise_multiplier, self.clip_norm)
        self.strategy.summary()

    def start(
        self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
        timeout: float = 3600, train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Any:
        """Flower's ``Strategy.start`` with the final estimate after ``num_rounds``, and the
        ``evaluate_fn`` metrics also written to TensorBoard as ``val/<key>`` (e.g.
        ``val/accuracy``)."""
        self.num_rounds = int(num_rounds)

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            res = evaluate_fn(server_round, arrays) if evaluate_fn is not None else None
            if res is not None:
                self._early.append((_numeric(res, "val/"), server_round))
                if self.reporter is not None:
                    for values, rnd in self._early:
                        self.reporter.scalars(values, self._offset + rnd)
                    self._early.clear()
            return res

        result = super().start(grid, initial_arrays, num_rounds, timeout, train_config,
                               evaluate_config, evaluate if evaluate_fn is not None else None)
        self.finish()
        return result

    # ------------------------------------------------------------------ results
    def compute(self, *, bootstrap: int = 0) -> CanaryReport | None:
        """Every estimate so far (None until 2 canaries took part). Logs nothing."""
        if self.reporter is None:
            return None
        self.last_report = self.reporter.compute(bootstrap=bootstrap)
        return self.last_report

    def finish(self) -> str | None:
        """The final estimate (with ``bootstrap`` intervals), logged, and the summary written
        atomically to ``log_dir/summary_filename``; once per round reached. Returns its path."""
        if self.backend is None or self.reporter is None:
            return None
        if self._finished_at == self.backend.rounds:
            return self.summary_path
        self._finished_at = self.backend.rounds
        report = self._report(bootstrap=self.bootstrap)
        summary = self.reporter.summary(report)
        summary["inputs"]["round_events"] = {str(k): v for k, v in self.round_events.items()}
        if self.log_dir is not None:
            try:
                self.summary_path = write_summary(self.log_dir, self.summary_filename,
                                                  {**summary, "versions": flower_versions()})
            except OSError as err:
                LOGGER.log(WARNING, "CanaryStrategy: the summary could not be written (%s)", err)
        return self.summary_path

    def _report(self, *, bootstrap: int) -> CanaryReport | None:
        """Compute and log the estimates; an error in the audit is logged, never raised into
        the server app (the training goes on)."""
        assert self.reporter is not None
        try:
            self.last_report = self.reporter.compute(bootstrap=bootstrap)
            self.reporter.log(self.last_report)
        except (ValueError, RuntimeError, FloatingPointError, OSError) as err:
            LOGGER.log(WARNING, "CanaryStrategy: no estimate after round %d (%s: %s)",
                       self.backend.rounds if self.backend else 0, type(err).__name__, err)
            self.last_report = None
        return self.last_report

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The audit's state (canaries' statistics, participations, rounds, last model)."""
        if self.backend is None or self.layout is None:
            return {}
        return {"backend": self.backend.state_dict(),
                "layout": [list(e) for e in self.layout.entries],
                "round_events": dict(self.round_events)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` now, or at the first round of a new run; a resumed run's
        rounds add to the restored ones.

        Raises:
            ValueError: the state's model layout or canaries differ from this run's.
        """
        if not state:
            return
        if self.backend is None:
            self._pending_state = state
        else:
            self._restore(state)

    def _restore(self, state: dict[str, Any]) -> None:
        assert self.backend is not None and self.layout is not None
        layout = tuple((k, tuple(s), d) for k, s, d in state["layout"])
        if layout != self.layout.entries:
            raise ValueError("CanaryStrategy: the checkpointed model's arrays differ from this "
                             "run's")
        self.backend.load_state_dict(state["backend"])
        self._offset = self.backend.rounds
        self.round_events = {int(k): v for k, v in state.get("round_events", {}).items()}


def _numeric(metrics: MetricRecord, prefix: str) -> dict[str, float | None]:
    return {f"{prefix}{k}": float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}

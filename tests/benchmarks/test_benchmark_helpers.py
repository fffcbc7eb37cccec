"""Benchmark helpers that decide what is measured: ``_common.HookTimer`` (which hooks it times
and how it counts, not how long) and ``canary_overhead.matched_baseline`` (the baseline's step)."""

from __future__ import annotations

import lightning.pytorch as pl

from benchmarks._common import HookTimer


class _Backend:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def client_update_sum(self) -> str:
        self.seen.append("sum")
        return "sum"

    def on_round_released(self) -> None:
        self.seen.append("released")


class _Audit(pl.Callback):
    """Overrides setup, on_fit_end and a federated hook; on_fit_end calls its own setup."""

    def __init__(self) -> None:
        self.backend: _Backend | None = None

    def setup(self, trainer: object, pl_module: object, stage: str) -> None:
        self.backend = self.backend or _Backend()

    def on_federated_round_end(self, *args: object) -> None:
        assert self.backend is not None
        self.backend.client_update_sum()
        self.backend.on_round_released()

    def on_fit_end(self, trainer: object, pl_module: object) -> str:
        self.setup(trainer, pl_module, "fit")  # nested: not counted twice
        return "done"


def test_attach_hooks_times_only_the_hooks_a_callback_overrides() -> None:
    timer = HookTimer()
    audit = _Audit()
    assert timer.attach_hooks(audit, prefix="A.") == ["on_federated_round_end", "on_fit_end", "setup"]
    assert audit.on_fit_end(None, None) == "done"  # the wrapped method returns what it returned
    assert timer.calls == {"A.on_fit_end": 1}  # the nested setup call is inside a timed call
    audit.on_train_start(None, None)  # Lightning's no-op default: not wrapped, not counted
    assert set(timer.calls) == {"A.on_fit_end"}
    assert timer.wall["A.on_fit_end"] >= 0.0 and timer.cpu["A.on_fit_end"] >= 0.0


def test_attach_audit_wraps_the_backend_once_setup_has_bound_it() -> None:
    timer = HookTimer()
    audit = _Audit()
    timer.attach_audit(audit, backend_calls=("client_update_sum", "on_round_released"))
    audit.setup(None, None, "fit")
    audit.setup(None, None, "fit")  # wrapping twice would count a backend call twice
    for _ in range(3):
        audit.backend.client_update_sum()  # called by the module, outside any hook
        audit.backend.on_round_released()
    audit.on_federated_round_end()  # inside a hook: counted once, under the hook
    assert timer.calls == {"setup": 2, "client_update_sum": 3, "on_round_released": 3,
                           "on_federated_round_end": 1}
    assert audit.backend.seen.count("sum") == 4
    assert list(timer.by_name()) == sorted(timer.wall, key=lambda k: -timer.wall[k])
    assert timer.totals()["wall_s"] == sum(d["wall_s"] for d in timer.by_name().values())


def test_the_matched_baseline_takes_the_audited_runs_step_on_the_same_real_updates() -> None:
    from benchmarks import canary_overhead as co

    cfg = co.train_config(clients=500, clients_per_round=50, server_lr=0.9)
    base = co.matched_baseline(cfg, {"hadamard": {"num_canaries": 1000}, "gaussian": {"num_canaries": 1000}})
    audited = co.audited_per_round(cfg, 1000)
    assert audited == 150
    # the real updates' step: server_lr / clients_per_round, equal in both runs
    assert base["server_lr"] / base["clients_per_round"] == cfg["server_lr"] / audited
    assert {k: v for k, v in base.items() if k != "server_lr"} == {k: v for k, v in cfg.items() if k != "server_lr"}
    assert cfg["server_lr"] == 0.9  # not modified
    # variants of different k have no one matched baseline: the configuration as it is
    assert co.matched_baseline(cfg, {"a": {"num_canaries": 1000}, "b": {"num_canaries": 300}}) == cfg

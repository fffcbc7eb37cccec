"""The canary statistics have one owner, the auditor: backends describe their releases and emit
them, and build or feed no statistic (a walk over the package's syntax trees)."""

from __future__ import annotations

import ast
import pathlib

from audit_callbacks.canary.base import MATCHED, CanaryStatistic

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "audit_callbacks"
CANARY = PACKAGE / "canary"
OWNER = PACKAGE / "auditing" / "auditor.py"
#: the methods by which a statistic is fed or read
FEEDS = {"fold", "add_delta", "update", "flush", "scores", "estimate", "score_auditor",
         "restart", "last_iterate_shifts"}


def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _statistic_classes() -> set[str]:
    """The classes of ``canary/`` that fold releases, and the projection machinery."""
    names = set()
    for path in CANARY.glob("*.py"):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                if "fold" in methods or node.name in ("Projection", "BlockBuffer"):
                    names.add(node.name)
    return names - {"CanaryStatistic"}  # the Protocol


def _called(tree: ast.Module) -> set[str]:
    """Names called in ``tree`` (``Name(...)`` and ``x.Name(...)``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            out.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
    return out


def test_the_statistic_classes_are_found():
    assert {"CanaryStatistics", "KnownRoundScores", "StepsUnknownScores", "Projection",
            "BlockBuffer"} <= _statistic_classes()


def test_no_backend_builds_or_feeds_a_statistic():
    classes = _statistic_classes() | {"matched_statistic"}
    paths = [*sorted((PACKAGE / "backends").rglob("*.py")), *sorted((PACKAGE / "flower").rglob("*.py"))]
    assert paths
    for path in paths:
        tree = _tree(path)
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names}
        assert not imported & classes, f"{path.name} imports {sorted(imported & classes)}"
        assert not _called(tree) & classes, f"{path.name} builds {sorted(_called(tree) & classes)}"
        for node in ast.walk(tree):  # no statistic reached through the auditor or kept
            if isinstance(node, ast.Attribute) and node.attr in ("matched", "stats", "statistics"):
                raise AssertionError(f"{path.name}:{node.lineno} reaches .{node.attr}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in FEEDS - {"update", "scores", "estimate"}):
                raise AssertionError(f"{path.name}:{node.lineno} calls .{node.func.attr}()")


def test_the_auditor_is_the_only_owner_of_the_statistics():
    classes = _statistic_classes() | {"matched_statistic"}
    builders = set()
    for path in PACKAGE.rglob("*.py"):
        if CANARY in path.parents:
            continue
        if _called(_tree(path)) & classes:
            builders.add(path)
    assert builders == {OWNER}


def test_every_matched_statistic_implements_the_interface():
    from audit_callbacks.canary.known_rounds import KnownRoundScores
    from audit_callbacks.canary.statistics import CanaryStatistics
    from audit_callbacks.canary.steps_unknown import StepsUnknownScores
    from audit_callbacks.canary.vectors import CanarySet

    cs = CanarySet(0, 300, 20, kind="hadamard")
    built = [CanaryStatistics(cs, 10, 10),
             KnownRoundScores(cs, 10, clip_norm=1.0, divisor=2, noise_multiplier=1.0),
             StepsUnknownScores(cs, 10, 10, max_grad_norm=1.0, noise_multiplier=1.0)]
    for stat in built:
        assert isinstance(stat, CanaryStatistic), type(stat).__name__
        assert stat.reads in ("model_delta", "noisy_sum")
    assert len({s.state_key for s in built}) == len(built)
    assert set(MATCHED) and all(callable(b) for b in MATCHED.values())


class _KnownRoundsBackend:
    """A DP-FedAvg-like release: model deltas of a noisy average (the auditor builds the
    known-rounds statistic from this description)."""

    dim, population, sign, training, default_delta = 1024, 100, 1.0, "sim", 1e-5
    analytic_names = ("epsilon_analytic",)

    def attach(self, auditor):
        pass

    def release_model(self, kind):
        from audit_callbacks.canary.base import NoisyAverageDelta

        return NoisyAverageDelta(clip_norm=1.0, divisor=10, noise_multiplier=1.0, server_momentum=0.5)

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def _known_rounds_auditor(rounds):
    import numpy as np
    import torch

    from audit_callbacks.auditing.auditor import CanaryAuditor
    from audit_callbacks.auditing.config import CanaryAuditConfig

    auditor = CanaryAuditor(CanaryAuditConfig(20, 100, seed=0, delta=1e-5), _KnownRoundsBackend(),
                            lambda key, msg: None)
    auditor.start(torch.zeros(1024))
    g = torch.Generator().manual_seed(1)
    for t in range(rounds):
        auditor.release(torch.randn(1024, generator=g), np.array([t % 20, (t + 3) % 20]))
    return auditor


def test_the_auditor_builds_feeds_and_checkpoints_the_matched_statistic():
    import numpy as np

    from audit_callbacks.auditing.checksum import CHECKSUM_KEY, field_digests
    from audit_callbacks.canary.known_rounds import KnownRoundScores

    auditor = _known_rounds_auditor(6)
    assert isinstance(auditor.matched, KnownRoundScores) and auditor.matched.rounds == 6
    assert auditor.statistics == [auditor.stats, auditor.matched]
    state = auditor.state_dict()
    assert "known_rounds" in state and "known_rounds" not in state["backend"]
    # a checkpoint of the older layout (the statistic in the backend's state) still loads
    old = {key: value for key, value in state.items() if key not in ("known_rounds", CHECKSUM_KEY)}
    old["backend"] = {"known_rounds": state["known_rounds"]}
    old[CHECKSUM_KEY] = {"sha256": field_digests(old)}
    for saved in (state, old):
        resumed = _known_rounds_auditor(0)
        resumed.load_state_dict(saved)
        for key in ("sums", "counts", "momentum_sums"):
            np.testing.assert_array_equal(getattr(resumed.matched, key), getattr(auditor.matched, key))
        assert resumed.matched.rounds == 6


def test_every_backend_answers_what_the_auditor_needs():
    import typing

    from audit_callbacks.backends.base import CanaryBackend, LightningHooks
    from audit_callbacks.backends.fedavg import FedAvgBackend
    from audit_callbacks.backends.opacus.backend import OpacusBackend
    from audit_callbacks.backends.opacus.lightning import LightningOpacusBackend
    from audit_callbacks.flower.backend import FlowerBackend

    members = typing.get_protocol_members(CanaryBackend) if hasattr(typing, "get_protocol_members") else {
        name for name in vars(CanaryBackend) if not name.startswith("_")}
    methods = {name for name in members if callable(getattr(CanaryBackend, name, None))}
    assert {"release_model", "analytic", "flat_parameters", "attach"} <= methods
    for cls in (FedAvgBackend, OpacusBackend, LightningOpacusBackend, FlowerBackend):
        missing = {name for name in methods if not callable(getattr(cls, name, None))}
        assert not missing, f"{cls.__name__} lacks {sorted(missing)}"
    # the Lightning hooks are a mixin of the Lightning backends only
    hooks = {"on_setup", "on_fit_start", "on_federated_round_end"}
    assert not hooks & set(dir(OpacusBackend)) and not hooks & set(dir(FlowerBackend))
    assert issubclass(FedAvgBackend, LightningHooks) and issubclass(LightningOpacusBackend, LightningHooks)

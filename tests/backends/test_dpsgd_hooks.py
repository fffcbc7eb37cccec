"""The chained step hooks of Opacus' single ``step_hook`` slot: a hook removed from the middle
of the chain is really gone, whatever the order in which callbacks installed and removed theirs
(issue 27, item 5: a disabled label callback's hook still ran and stopped the fit)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from audit_callbacks.backends.opacus.optimizer import chain_step_hook, unchain_step_hook


@pytest.mark.parametrize("remove", [("a",), ("b",), ("a", "b"), ("b", "a")])
def test_removed_hooks_never_run_whatever_the_order(remove):
    calls: list[str] = []
    opt = SimpleNamespace(step_hook=lambda o: calls.append("accountant"))
    hooks = {name: chain_step_hook(opt, lambda o, n=name: calls.append(n)) for name in ("a", "b")}
    opt.step_hook(opt)
    assert calls == ["accountant", "a", "b"]
    for name in remove:
        unchain_step_hook(opt, hooks[name])
    calls.clear()
    opt.step_hook(opt)
    assert calls == ["accountant", *[n for n in ("a", "b") if n not in remove]]

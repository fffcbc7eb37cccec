"""Find a run's Opacus ``DPOptimizer`` and its accountant, and chain the accountant's
single ``step_hook`` slot (the previous hook runs first and stays reachable)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from opacus.accountants import IAccountant
from opacus.optimizers import DPOptimizer


def find_dp_optimizer(optimizers: Iterable[Any]) -> DPOptimizer | None:
    """The first Opacus ``DPOptimizer`` among ``optimizers`` (e.g. ``trainer.optimizers``)."""
    for opt in optimizers:
        inner = getattr(opt, "optimizer", opt)  # LightningOptimizer wraps the real one
        for candidate in (opt, inner):
            if isinstance(candidate, DPOptimizer):
                return candidate
    return None


def _hook_closure(hook: Callable[..., Any] | None) -> dict[str, Any]:
    if hook is None:
        return {}
    try:
        return dict(inspect.getclosurevars(hook).nonlocals)
    except (TypeError, ValueError):  # builtins, partials: nothing to read
        return {}


def find_accountant(optimizer: DPOptimizer) -> tuple[IAccountant | None, float | None]:
    """The accountant and the sampling rate the optimizer's step hook reports to.

    ``PrivacyEngine.make_private`` attaches ``accountant.get_optimizer_hook_fn(sample_rate)``, a
    closure over the accountant (``self``) and ``sample_rate`` (Opacus 1.x). Hooks chained by
    :func:`chain_step_hook` are followed through their ``previous`` hook.

    Returns:
        ``(accountant, sample_rate)``; either is None when the hook does not reveal it.
    """
    hook = optimizer.step_hook
    for _ in range(32):  # chained hooks, each holding the previous one
        if hook is None:
            break
        cells = _hook_closure(hook)
        acc = next((v for v in cells.values() if isinstance(v, IAccountant)), None)
        if acc is not None:
            rate = cells.get("sample_rate")
            return acc, (float(rate) if isinstance(rate, (int, float)) else None)
        hook = getattr(hook, "previous", None)
    return None, None


def chain_step_hook(optimizer: DPOptimizer, fn: Callable[[DPOptimizer], None]) -> Callable[[DPOptimizer], None]:
    """Install ``fn`` in the optimizer's single ``step_hook`` slot, after the existing hook.

    The installed hook calls the previous hook (the accountant's, usually) and then ``fn``; it
    runs after clipping, noise and scaling, before the parameters move, so ``p.grad`` is the
    privatized gradient. Returns the installed hook (pass it to :func:`unchain_step_hook`).
    """
    def hook(optim: DPOptimizer) -> None:
        previous = hook.previous  # type: ignore[attr-defined]  # read at call time: unchaining
        if previous is not None:  # a hook below this one replaces this attribute
            previous(optim)
        fn(optim)

    hook.previous = optimizer.step_hook  # type: ignore[attr-defined]
    hook.audit_fn = fn  # type: ignore[attr-defined]
    optimizer.step_hook = hook
    return hook


def unchain_step_hook(optimizer: DPOptimizer, installed: Callable[[DPOptimizer], None]) -> None:
    """Remove a hook installed by :func:`chain_step_hook`, keeping every other hook in place."""
    parent, hook = None, optimizer.step_hook
    while hook is not None:
        if hook is installed:
            prev = getattr(hook, "previous", None)
            if parent is None:
                optimizer.step_hook = prev
            else:
                parent.previous = prev  # type: ignore[attr-defined]
            return
        parent, hook = hook, getattr(hook, "previous", None)



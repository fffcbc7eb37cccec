"""The benchmarks' harness: the command line written once (:func:`parser`), the one writer of
``benchmarks/results/<name>.json`` with the machine it ran on (:func:`write_json`: CPU, cores,
torch/numpy versions, device), timers, peak RSS.

Not part of the library; imported by the benchmarks of this package only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def load_example(name: str) -> Any:
    """``examples/<name>.py`` as the module ``name``, loaded from its file (the name
    ``examples`` is taken in site-packages by Opacus' own examples package, and the benchmarks
    edit no ``sys.path``); the module already loaded under that name, if any (the examples
    import ``_cli`` by that name)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# --accelerator {auto,cpu,gpu}: one helper for the examples and the benchmarks (examples/_cli.py)
_cli = load_example("_cli")
ACCELERATORS = _cli.ACCELERATORS
add_accelerator_argument = _cli.add_accelerator_argument
device_name = _cli.device_name
resolve_accelerator = _cli.resolve_accelerator
torch_device = _cli.torch_device
trainer_kwargs = _cli.trainer_kwargs


def parser(doc: str | None, *, quick: str | None = None, output: str | None = None,
           summary: bool = False) -> argparse.ArgumentParser:
    """A benchmark's command line: its docstring as the description (``summary``: the first
    paragraph only), ``--quick`` (a smoke test; ``quick`` is its help) and ``--output`` (a file
    name under ``benchmarks/results/``, default None; ``output`` is its help) when given."""
    text = doc or ""
    if summary:
        p = argparse.ArgumentParser(description=text.split("\n\n")[0])
    else:
        p = argparse.ArgumentParser(description=text, formatter_class=argparse.RawDescriptionHelpFormatter)
    if quick is not None:
        p.add_argument("--quick", action="store_true", help=quick or None)
    if output is not None:
        p.add_argument("--output", default=None, help=output)
    return p


def synchronize() -> None:
    """Wait for the CUDA device's queued work (``torch.cuda.synchronize``) when CUDA is in use,
    so that a ``perf_counter`` interval covers the work it launched; nothing on the CPU."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


#: the hooks a callback may override: Lightning's (``setup``, ``teardown``, ``on_*``) and the
#: federated round hooks of ``audit_callbacks.federated`` (``FederatedCallbackHooks``)
FEDERATED_HOOKS = ("on_federated_round_start", "on_federated_round_end")


class HookTimer:
    """Wall (``perf_counter``) and CPU (``thread_time``) seconds and calls, per name, of methods
    wrapped on instances (the library is not modified). A call made inside another timed call
    is not counted twice.

    With ``sync`` the CUDA device is synchronised before and after each outermost call, so a
    call's wall time covers the kernels it launched and none queued before it: for a
    profiling fit only, never inside a timed pair (the synchronisations are the timer's).
    """

    def __init__(self, sync: bool = False) -> None:
        self.sync = sync
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._depth = 0

    def wrap(self, obj: Any, attr: str, name: str | None = None, after: Any = None) -> None:
        """Time ``obj.attr`` under ``name`` (default ``attr``); ``after()`` runs after each call."""
        fn = getattr(obj, attr, None)
        if not callable(fn) or getattr(fn, "_timed", False):
            return
        key = name or attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            if self.sync:
                synchronize()
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.sync:
                    synchronize()
                self.wall[key] = self.wall.get(key, 0.0) + time.perf_counter() - w0
                self.cpu[key] = self.cpu.get(key, 0.0) + time.thread_time() - c0
                self.calls[key] = self.calls.get(key, 0) + 1
                self._depth -= 1
                if after is not None:
                    after()

        timed._timed = True  # type: ignore[attr-defined]
        setattr(obj, attr, timed)

    def attach_hooks(self, callback: Any, prefix: str = "") -> list[str]:
        """Time every hook ``callback``'s class overrides (``prefix + hook`` names); returns them."""
        from lightning.pytorch import Callback

        hooks = sorted({n for n in dir(Callback) if n.startswith("on_") or n in ("setup", "teardown")}
                       | set(FEDERATED_HOOKS))
        mine = [h for h in hooks if callable(getattr(type(callback), h, None))
                and getattr(type(callback), h) is not getattr(Callback, h, None)]
        for h in mine:
            self.wrap(callback, h, prefix + h)
        return mine

    def attach_audit(self, audit: Any, backend_calls: tuple[str, ...] = ("client_update_sum", "client_updates",
                                                                          "on_round_released")) -> None:
        """Time a ``CanaryAudit``'s hooks and, once its ``setup`` has bound a backend, the
        backend's ``backend_calls`` (DP-FedAvg's canary updates and release, which the module
        calls outside any callback hook)."""

        def wrap_backend() -> None:
            if audit.backend is not None:
                for name in backend_calls:
                    self.wrap(audit.backend, name)

        self.wrap(audit, "setup", after=wrap_backend)  # first: attach_hooks skips a timed method
        self.attach_hooks(audit)

    def totals(self) -> dict[str, float]:
        return {"wall_s": sum(self.wall.values()), "cpu_s": sum(self.cpu.values())}

    def by_name(self) -> dict[str, dict[str, float]]:
        """``{name: {"wall_s", "cpu_s", "calls"}}``, the largest wall first."""
        return {k: {"wall_s": self.wall[k], "cpu_s": self.cpu[k], "calls": self.calls[k]}
                for k in sorted(self.wall, key=lambda k: -self.wall[k])}


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (``ru_maxrss``).

    Linux reports ``ru_maxrss`` in KiB, macOS in bytes.
    """
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1.0 if sys.platform == "darwin" else 1024.0
    return rss * scale / 2**20


def median_interval(values: Any, confidence: float = 0.95) -> dict[str, float]:
    """Distribution-free interval for the median of ``values``: the order statistics
    ``[x_(j), x_(n+1-j)]`` with the largest j whose coverage ``1 - 2 P(Binom(n, 1/2) <= j - 1)``
    is at least ``confidence`` (the sign-test interval). Returns ``lower``, ``upper`` and the
    exact ``coverage``; the whole range (coverage ``1 - 2^(1-n)``) when n is too small."""
    from scipy.stats import binom

    x = sorted(float(v) for v in values)
    n = len(x)
    j = 1
    while j + 1 <= n // 2 and 1 - 2 * binom.cdf(j, n, 0.5) >= confidence:
        j += 1
    return {"lower": x[j - 1], "upper": x[n - j], "coverage": float(1 - 2 * binom.cdf(j - 1, n, 0.5)),
            "n": n}


def _version(name: str) -> str | None:
    try:
        module = __import__(name)
    except Exception:  # noqa: BLE001 - an optional package may be missing or broken
        return None
    return str(getattr(module, "__version__", "unknown"))


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (other processes compete for the CPUs)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict[str, Any]:
    """CPU count, torch threads, load average and library versions, for every result file."""
    import torch

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        affinity = None
    return {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "torch_num_threads": torch.get_num_threads(),
        "load_average_1_5_15": load_average(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "versions": {
            name: _version(name)
            for name in ("torch", "numpy", "scipy", "lightning", "tensorboard", "matplotlib")
        },
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def git_state() -> dict[str, Any]:
    """The commit measured and the files modified beside it (``git`` in the repository, else
    the environment's ``AUDIT_BENCH_COMMIT``: a run from an exported snapshot of a commit)."""
    import subprocess

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                                 check=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip("\n")  # not strip(): a porcelain line starts with a space

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": os.environ.get("AUDIT_BENCH_COMMIT"), "modified": None, "snapshot": True}
    status = git("status", "--porcelain") or ""
    return {"commit": commit, "modified": [ln[3:] for ln in status.splitlines()], "snapshot": False}


def _clean(obj: Any) -> Any:
    """JSON-safe copy: numpy scalars/arrays to Python, non-finite floats to None."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return _clean(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def current_device() -> str:
    """The device the run used: the CUDA device's name once CUDA was initialised, else the CPU's."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return device_name(torch.device("cuda"))
    return device_name(torch.device("cpu"))


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``benchmarks/results/<name>`` (pretty, keys in their order): the one
    writer of every result file, each with the machine it ran on (``payload["machine"]``,
    :func:`machine_info`, added when the benchmark did not, and its ``device``)."""
    payload = dict(payload)
    machine = dict(payload.get("machine") or machine_info())
    machine.setdefault("device", current_device())
    payload["machine"] = machine
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / name
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(_clean(payload), fh, indent=2)
        fh.write("\n")
    return path


def timed_fit(trainer: Any, module: Any, datamodule: Any, profile: Any = None) -> float:
    """``trainer.fit(module, datamodule=...)`` timed with ``perf_counter`` (seconds), optionally
    under an enabled ``cProfile.Profile``; on CUDA the interval ends after the device's queued
    work (:func:`synchronize` on both sides)."""
    synchronize()
    start = time.perf_counter()
    if profile is not None:
        profile.enable()
    try:
        trainer.fit(module, datamodule=datamodule)
        synchronize()
    finally:
        if profile is not None:
            profile.disable()
    return time.perf_counter() - start


def short_path(path: str) -> str:
    """A profiled file's path relative to site-packages or to the repository."""
    for marker in ("site-packages/", f"{ROOT}/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def profile_tables(prof: Any, top: int, exclude: tuple[str, ...] = ()) -> tuple[list[dict], list[dict], str]:
    """From an enabled-then-disabled ``cProfile.Profile``: the library's functions by cumulative
    time (``audit_callbacks/`` minus names containing any of ``exclude``), the ``top`` functions
    by own time, and pstats' text listing of the library."""
    import io
    import pstats

    stats = pstats.Stats(prof)
    rows = [
        {"function": f"{short_path(filename)}:{line}({func})", "calls": nc, "tottime_s": tt, "cumtime_s": ct}
        for (filename, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items()
    ]
    in_lib = sorted(
        (r for r in rows if "audit_callbacks/" in r["function"] and not any(e in r["function"] for e in exclude)),
        key=lambda r: -r["cumtime_s"],
    )
    heavy = sorted(rows, key=lambda r: -r["tottime_s"])[:top]
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(r"audit_callbacks", top)
    return in_lib, heavy, buf.getvalue()


def timing_subclass(base: type, hooks: tuple[str, ...]) -> type:
    """``base`` whose ``hooks`` time themselves: ``hook_seconds`` (total), ``hook_calls`` and
    ``hook_times`` (every call's wall time), per hook name."""
    from collections import defaultdict

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)
        self.hook_seconds = defaultdict(float)
        self.hook_calls = defaultdict(int)
        self.hook_times = defaultdict(list)

    cls = type(f"Timed{base.__name__}", (base,), {"__init__": __init__})

    def timed(name: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return getattr(super(cls, self), name)(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.hook_seconds[name] += elapsed
                self.hook_calls[name] += 1
                self.hook_times[name].append(elapsed)

        method.__name__ = name
        return method

    for name in hooks:
        setattr(cls, name, timed(name))
    return cls


def interleaved_pairs(one: Any, variants: Any, reps: int, warmup: bool
                      ) -> tuple[list[Any], dict[str, list[tuple[Any, Any]]]]:
    """``reps`` (baseline, variant) pairs per variant, the order alternating (ABBA), after one
    untimed warm-up run of each (``warmup``); ``one(variant, i)`` runs one fit ("baseline" for
    the baseline, i = -1 for the warm-up). Returns ``(warm_runs, {variant: [(base, audited)]})``."""
    warm = [one(v, -1) for v in ("baseline", *variants)] if warmup else []
    pairs: dict[str, list[tuple[Any, Any]]] = {v: [] for v in variants}
    for i in range(reps):
        for v in variants:
            if i % 2 == 0:
                b = one("baseline", i)
                a = one(v, i)
            else:
                a = one(v, i)
                b = one("baseline", i)
            pairs[v].append((b, a))
    return warm, pairs

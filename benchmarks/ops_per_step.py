"""What the canary audit adds to one logical step in operations: aten ops (CPU profiler), CUDA kernels and time.

    PYTHONPATH=. .venv/bin/python -m benchmarks ops_per_step                    # auto: CUDA if present
    PYTHONPATH=. .venv/bin/python -m benchmarks ops_per_step --accelerator cpu  # ~3 min on 2 cores
    PYTHONPATH=. .venv/bin/python -m benchmarks ops_per_step --quick            # smoke test (small models)

One logical step of Opacus DP-SGD (and one DP-FedAvg round) is profiled with
``torch.profiler`` twice, without and with the audit, from the same seed and after the same
warm-up steps, and the counts are subtracted:

* ``top``: the aten ops dispatched at the top level (an aten op not inside another aten op:
  what Python code calls, the measure of launch-bound per-step work);
* ``all``: every aten op event, those inside other ops included (e.g. the per-tensor norms
  of ``_foreach_norm``'s CPU fallback);
* ``kernels`` (CUDA only): device kernels, memcpys and memsets the step ran;
* ``time``: the step's wall time (CUDA synchronised), median over ``--steps`` steps of each
  run taken in alternation (plain loop) or over a fit of each (Lightning), and the audit's
  marginal cost as the median paired difference with its sign-test interval (plain loop: both
  runs step on the same Poisson batches, the audited run's); ``cpu_time``
  (plain loop on the CPU): the same from the thread's CPU time (``time.thread_time``; torch on
  one thread), which a shared host's other processes disturb far less than the wall time.

Models (``MODELS``; Poisson batches of expected size ``--batch-size``):

* ``mlp6`` / ``mlp48``: ``Linear(32, 32)`` + ReLU blocks on 32 features (6 and 48 parameter
  tensors, d = 2,244 and 24,420), the issue's models;
* ``cnn``: ``gpu_overhead.py``'s GroupNorm CNN on 3 x 32 x 32 (d = 1,070,986; 12 tensors);
* ``transformer``: 4 pre-norm transformer blocks (width 64, 4 heads, Opacus'
  ``DPMultiheadAttention``, MLP 128) over 16 tokens of a 64-word vocabulary (69 tensors).

Front ends: ``plain`` (``OpacusCanaryAudit(optimizer, num_canaries=500)`` on a hand-written
loop), ``lightning`` (``CanaryAudit(num_canaries=500)`` on ``DPSGDClassifier``, the step from
``on_train_batch_start`` to the audit's ``on_train_batch_end``), and ``fedavg`` (``DPFedAvg``
of an MLP on EMNIST-shaped data, 200 clients, 10 a round, ``CanaryAudit()``: one round; the
audit's ops are those inside ``FedAvgBackend``'s per-round methods, as the real clients of a
round differ with and without canary clients, and no time difference is given). Lightning's
times come from two fits, not paired steps: their interval is indicative only. No estimate
runs during the profiled steps.

The budget (``BUDGET``): at most 300 aten ops added to one Opacus logical step of the 48-tensor
MLP and at most 4 more for each further parameter tensor (the slope between ``mlp6`` and
``mlp48``), in ``top`` ops and in ``all`` events; the JSON records both counts and whether each
holds.

Output: a table and ``benchmarks/results/ops_per_step.json`` (``ops_per_step_quick.json`` with
``--quick``; ``--output`` names another file).
"""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from opacus.layers import DPMultiheadAttention
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks.backends.fedavg import FedAvgBackend
from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.federated import DPFedAvg
from audit_callbacks.plain import OpacusCanaryAudit
from benchmarks._common import (
    add_accelerator_argument,
    device_name,
    git_state,
    machine_info,
    median_interval,
    parser,
    synchronize,
    torch_device,
    write_json,
)
from benchmarks.gpu_overhead import OPACUS_CNN, emnist_shaped, make_trainer, quiet
from models import build_model
from models.dpsgd import DPSGDClassifier

#: The audit's budget per Opacus logical step (top-level aten ops and all events): at most ``added`` at 48
#: parameter tensors, at most ``per_tensor`` more for each further tensor.
BUDGET = {"added_at_48_tensors": 300, "per_tensor": 4}
#: The DP-FedAvg backend's per-round methods (the canary clients' updates and the release)
FEDAVG_PIECES = ("client_update_sum", "on_round_released", "on_federated_round_end")
NO_ESTIMATE = 10**6  # every_n_epochs beyond the run: no estimate during the profiled steps
K = 500  # observed canaries (the OpacusCanaryAudit(500))


# ------------------------------------------------------------------------------ models
class Block(nn.Module):
    """A pre-norm transformer block: LayerNorm, Opacus' multi-head attention, LayerNorm, MLP."""

    def __init__(self, width: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = DPMultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    """Token ids ``[N, T]`` -> logits ``[N, classes]``: embedding, ``blocks`` blocks, LayerNorm,
    mean over tokens, linear head."""

    def __init__(self, vocab: int = 64, width: int = 64, heads: int = 4, hidden: int = 128,
                 blocks: int = 4, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*[Block(width, heads, hidden) for _ in range(blocks)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(tokens))).mean(1))


def _mlp(depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(32, 4))


def _data(kind: str, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "cnn":
        return torch.randn(n, 3, 32, 32, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    if kind == "transformer":
        return torch.randint(0, 64, (n, 16), generator=gen), torch.randint(0, 4, (n,), generator=gen)
    return torch.randn(n, 32, generator=gen), torch.randint(0, 4, (n,), generator=gen)


#: name -> (model builder, data kind)
MODELS: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "mlp6": (lambda: _mlp(2), "mlp"),
    "mlp48": (lambda: _mlp(23), "mlp"),
    "cnn": (lambda: build_model("cnn", (3, 32, 32), 10, **OPACUS_CNN), "cnn"),
    "transformer": (lambda: TinyTransformer(), "transformer"),
}
QUICK_MODELS = ("mlp6", "mlp48", "transformer")


# ------------------------------------------------------------------------------ counting
class OpCount:
    """Profile what runs between :meth:`start` and :meth:`stop` (CPU, and CUDA kernels when the
    device is CUDA); :attr:`counts` is ``{top, all, kernels}`` (kernels None on the CPU)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.counts: dict[str, int | None] | None = None
        self._prof: Any = None

    def start(self) -> None:
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        synchronize()
        self._prof = profile(activities=acts)
        self._prof.__enter__()

    def stop(self) -> None:
        synchronize()
        self._prof.__exit__(None, None, None)
        self.counts = count_events(self._prof, self.cuda)


def count_events(prof: Any, cuda: bool) -> dict[str, int | None]:
    """``{top, all, kernels, audit_top, audit_all}`` of a finished ``torch.profiler.profile``:
    top-level aten ops, every aten op event, the CUDA device events (None without CUDA), and the
    top-level and all aten ops inside a ``record_function("audit::...")`` range (the audit's
    own methods, where :func:`_label` wrapped them)."""
    top = every = kernels = audit_top = audit_all = 0
    for e in prof.events():
        if cuda and e.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
            continue
        if not e.name.startswith("aten::"):
            continue
        every += 1
        parent, nested, audit = e.cpu_parent, False, False
        while parent is not None:
            nested = nested or parent.name.startswith("aten::")
            audit = audit or parent.name.startswith("audit::")
            parent = parent.cpu_parent
        top += not nested
        audit_top += audit and not nested
        audit_all += audit
    return {"top": top, "all": every, "kernels": kernels if cuda else None, "audit_top": audit_top,
            "audit_all": audit_all}


def _label(cls: type, names: tuple[str, ...]) -> Callable[[], None]:
    """Wrap ``cls``'s methods ``names`` in ``record_function("audit::<name>")``; returns the undo."""
    saved = {name: cls.__dict__[name] for name in names}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            with record_function(f"audit::{name}"):
                return fn(self, *args, **kwargs)
        return method

    for name, fn in saved.items():
        setattr(cls, name, wrap(name, fn))

    def undo() -> None:
        for name, fn in saved.items():
            setattr(cls, name, fn)
    return undo


def count_ops(fn: Callable[[], Any], cuda: bool = False) -> dict[str, int | None]:
    """:func:`count_events` of one call of ``fn``."""
    c = OpCount(cuda)
    c.start()
    try:
        fn()
    finally:
        c.stop()
    assert c.counts is not None
    return c.counts


# ------------------------------------------------------------------------------ plain loop
def _private(model_name: str, device: torch.device, batch: int, examples: int, seed: int = 0):
    build, kind = MODELS[model_name]
    torch.manual_seed(seed)
    net = build().to(device)
    x, y = _data(kind, examples, torch.Generator().manual_seed(seed))
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = PrivacyEngine().make_private(
            module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.05), data_loader=loader,
            noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=True,
            noise_generator=torch.Generator(device=device).manual_seed(seed))
    return net, model, opt, loader


class PlainRun:
    """A hand-written Opacus loop (``audited``: with ``OpacusCanaryAudit``); :meth:`step` runs one
    logical step on the next Poisson batch."""

    def __init__(self, model_name: str, device: torch.device, batch: int, examples: int, audited: bool) -> None:
        self.net, self.model, self.opt, loader = _private(model_name, device, batch, examples)
        self.device = device
        self.audit = None
        if audited:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.audit = OpacusCanaryAudit(self.opt, data_loader=loader, num_canaries=K, log_figures=False,
                                               log_histograms=False)
        self.loader = loader
        self._it = iter(loader)
        self.tensors = sum(1 for p in self.net.parameters() if p.requires_grad)
        self.parameters = sum(p.numel() for p in self.net.parameters() if p.requires_grad)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            x, y = next(self._it)
        except StopIteration:
            self._it = iter(self.loader)
            x, y = next(self._it)
        return x.to(self.device), y.to(self.device)

    def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        x, y = batch
        self.opt.zero_grad()
        nn.functional.cross_entropy(self.model(x), y).backward()
        self.opt.step()


def plain_scenario(model_name: str, device: torch.device, batch: int, steps: int, warm: int) -> dict[str, Any]:
    """Ops of one logical step without and with the audit, and the steps' times (alternated)."""
    cuda = device.type == "cuda"
    examples = 40 * batch
    runs = {a: PlainRun(model_name, device, batch, examples, audited=a) for a in (False, True)}
    for _ in range(warm):
        b = runs[True].next_batch()
        for run in runs.values():
            run.step(b)
    # both runs step on the audited run's Poisson batches (its loader draws the canaries too): a
    # pair's difference is then the audit's, not that of two batch sizes
    ops = {}
    batch_xy = runs[True].next_batch()
    for audited, run in runs.items():
        ops["audited" if audited else "baseline"] = count_ops(lambda r=run, b=batch_xy: r.step(b), cuda)
    times: dict[str, list[float]] = {"baseline": [], "audited": []}
    cpu: dict[str, list[float]] = {"baseline": [], "audited": []}
    for i in range(steps):
        order = (False, True) if i % 2 == 0 else (True, False)
        b = runs[True].next_batch()
        for audited in order:
            run = runs[audited]
            synchronize()
            t0, c0 = time.perf_counter(), time.thread_time()
            run.step(b)
            synchronize()
            key = "audited" if audited else "baseline"
            times[key].append(time.perf_counter() - t0)
            cpu[key].append(time.thread_time() - c0)
    run = runs[True]
    res = _result(model_name, "plain", run.tensors, run.parameters, ops, times)
    if not cuda:  # this thread's CPU time: what the step computed, not the waits for a shared core
        res["cpu_time"] = _result(model_name, "plain", run.tensors, run.parameters, ops, cpu)["time"]
    return res


# ------------------------------------------------------------------------------ Lightning
class _Window(pl.Callback):
    """Start (``role="start"``, first in the callback list) or stop (``"stop"``, last) the
    profile of training step ``at``, and time every step (``state`` is shared by the pair)."""

    def __init__(self, role: str, counter: OpCount, at: int, times: list[float], state: dict[str, float]) -> None:
        self.role, self.counter, self.at, self.times, self.state = role, counter, at, times, state

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.role != "start":
            return
        if trainer.global_step == self.at:
            self.counter.start()
            self.state["profiling"] = 1.0
        synchronize()
        self.state["t0"] = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.role != "stop":
            return
        synchronize()
        self.times.append(time.perf_counter() - self.state["t0"])
        if self.state.pop("profiling", 0.0):
            self.counter.stop()


def _windows(counter: OpCount, at: int, times: list[float]) -> tuple[_Window, _Window]:
    state: dict[str, float] = {}
    return _Window("start", counter, at, times, state), _Window("stop", counter, at, times, state)


class _Images(pl.LightningDataModule):
    def __init__(self, kind: str, examples: int, batch: int) -> None:
        super().__init__()
        x, y = _data(kind, examples, torch.Generator().manual_seed(0))
        self.train_set, self.batch = TensorDataset(x, y), batch

    def train_dataloader(self) -> DataLoader:
        return DPDataLoader.from_data_loader(DataLoader(self.train_set, batch_size=self.batch),
                                             generator=torch.Generator().manual_seed(0))


def _lightning_fit(model_name: str, device: torch.device, batch: int, steps: int, warm: int, audited: bool,
                   log_root: str) -> tuple[dict[str, int | None], list[float], int, int]:
    build, kind = MODELS[model_name]
    pl.seed_everything(0, verbose=False)
    net = build()
    module = DPSGDClassifier(net, lr=0.05, noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5, noise_seed=0)
    counter, times = OpCount(device.type == "cuda"), []
    start, stop = _windows(counter, warm, times)
    callbacks: list[Any] = [start]
    if audited:
        callbacks.append(CanaryAudit(num_canaries=K, every_n_epochs=NO_ESTIMATE, log_figures=False,
                                     log_histograms=False))
    callbacks.append(stop)
    trainer = make_trainer(device, log_root, f"{model_name}_{audited}", callbacks, max_steps=warm + 1 + steps,
                           max_epochs=-1, limit_val_batches=0)
    trainer.fit(module, datamodule=_Images(kind, 40 * batch, batch))
    assert counter.counts is not None
    tensors = sum(1 for p in net.parameters() if p.requires_grad)
    return counter.counts, times[warm + 1:], tensors, sum(p.numel() for p in net.parameters())


def lightning_scenario(model_name: str, device: torch.device, batch: int, steps: int, warm: int,
                       log_root: str) -> dict[str, Any]:
    """Ops of one Lightning training step (Opacus) without and with ``CanaryAudit``."""
    ops, times = {}, {}
    tensors = parameters = 0
    for audited in (False, True):
        key = "audited" if audited else "baseline"
        ops[key], times[key], tensors, parameters = _lightning_fit(model_name, device, batch, steps, warm,
                                                                   audited, log_root)
    return _result(model_name, "lightning", tensors, parameters, ops, times)


def fedavg_scenario(device: torch.device, rounds: int, warm: int, log_root: str) -> dict[str, Any]:
    """Ops of one DP-FedAvg round (a training step of ``DPFedAvg``) without and with the audit."""
    dm = emnist_shaped(200, 10, 100, rounds_per_epoch=warm + 1 + rounds)
    ops, times = {}, {}
    tensors = parameters = 0
    for audited in (False, True):
        key = "audited" if audited else "baseline"
        pl.seed_everything(0, verbose=False)
        net = build_model("mlp", (1, 28, 28), 62, hidden=(64,))
        module = DPFedAvg(net, clients_per_round=10, noise_multiplier=1.0, clip_norm=1.0, local_epochs=1,
                          local_lr=0.05, local_batch_size=10, server_momentum=0.9, seed=0)
        counter, t = OpCount(device.type == "cuda"), []
        start, stop = _windows(counter, warm, t)
        callbacks: list[Any] = [start]
        if audited:
            callbacks.append(CanaryAudit(every_n_epochs=NO_ESTIMATE, log_figures=False, log_histograms=False))
        callbacks.append(stop)
        trainer = make_trainer(device, log_root, f"fedavg_{audited}", callbacks, max_steps=warm + 1 + rounds,
                               max_epochs=-1, limit_val_batches=0)
        undo = _label(FedAvgBackend, FEDAVG_PIECES)
        try:
            trainer.fit(module, datamodule=dm)
        finally:
            undo()
        assert counter.counts is not None
        ops[key], times[key] = counter.counts, t[warm + 1:]
        tensors = sum(1 for p in net.parameters() if p.requires_grad)
        parameters = sum(p.numel() for p in net.parameters())
    res = _result("mlp_emnist", "fedavg", tensors, parameters, ops, times)
    # a round's real clients differ with and without the canary clients (they are drawn from
    # N + k): the audit's own ops are those inside its methods, not the difference of totals
    res["added"] = {"top": ops["audited"]["audit_top"], "all": ops["audited"]["audit_all"], "kernels": None}
    res["added_is"] = "the ops inside FedAvgBackend's " + ", ".join(FEDAVG_PIECES)
    # nor is a difference of the rounds' times the audit's (other real clients): none is given
    res["time"] = {k: v for k, v in res["time"].items() if k not in ("added_ms", "added_fraction")}
    return res


# ------------------------------------------------------------------------------ results
def _result(model: str, front_end: str, tensors: int, parameters: int, ops: dict[str, dict[str, int | None]],
            times: dict[str, list[float]]) -> dict[str, Any]:
    added = {k: (None if ops["audited"][k] is None else int(ops["audited"][k]) - int(ops["baseline"][k]))
             for k in ("top", "all", "kernels")}
    base, aud = np.asarray(times["baseline"]) * 1e3, np.asarray(times["audited"]) * 1e3
    n = min(len(base), len(aud))
    timing: dict[str, Any] = {"steps": n}
    if n:
        timing.update(baseline_ms=float(np.median(base)), audited_ms=float(np.median(aud)))
        diff = aud[:n] - base[:n]
        timing["added_ms"] = {"median": float(np.median(diff)), **(median_interval(diff) if n >= 2 else {})}
        timing["added_fraction"] = float(np.median(diff) / np.median(base[:n]))
    return {"model": model, "front_end": front_end, "tensors": tensors, "parameters": parameters,
            "ops": ops, "added": added, "time": timing}


def budget_check(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The budget of :data:`BUDGET` on the ``mlp6`` / ``mlp48`` pairs of each front end, in
    top-level and in all aten ops."""
    out: dict[str, Any] = {}
    for front in ("plain", "lightning"):
        by = {r["model"]: r for r in results if r["front_end"] == front}
        if "mlp6" not in by or "mlp48" not in by:
            continue
        few, many = by["mlp6"], by["mlp48"]
        for kind in ("top", "all"):
            slope = (many["added"][kind] - few["added"][kind]) / (many["tensors"] - few["tensors"])
            out[f"{front}_{kind}"] = {
                "added_at_48_tensors": many["added"][kind], "per_tensor": slope,
                "holds": many["added"][kind] <= BUDGET["added_at_48_tensors"] and slope <= BUDGET["per_tensor"]}
    return out


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'front end':<10} {'model':<12} {'tensors':>7} {'top ops +':>10} {'all ops +':>10} "
          f"{'kernels +':>9} {'step ms':>9} {'added ms [95% CI]':>26}  (plain on the CPU: thread CPU time)")
    for r in results:
        t = r.get("cpu_time", r["time"])
        ci = t.get("added_ms", {})  # (none for a DP-FedAvg round)
        ci_s = (f"{ci['median']:.3f} [{ci.get('lower', float('nan')):.3f}, {ci.get('upper', float('nan')):.3f}]"
                if ci else "-")
        kern = r["added"]["kernels"]
        print(f"{r['front_end']:<10} {r['model']:<12} {r['tensors']:>7} {r['added']['top']:>10} "
              f"{r['added']['all']:>10} {'-' if kern is None else kern:>9} "
              f"{t.get('baseline_ms', float('nan')):>9.2f} {ci_s:>26}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__, quick="small models, a few steps: a smoke test", summary=True,
               output="result file name (default ops_per_step.json, ops_per_step_quick.json with --quick)")
    add_accelerator_argument(p)
    p.add_argument("--models", default=None, help=f"comma-separated, of {', '.join(MODELS)} (default: all)")
    p.add_argument("--front-ends", default="plain,lightning,fedavg", help="comma-separated: plain, lightning, fedavg")
    p.add_argument("--steps", type=int, default=None, help="timed steps of each run (default 30; --quick 2)")
    p.add_argument("--batch-size", type=int, default=64, help="expected Poisson batch (default 64)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    quiet()
    device = torch_device(args.accelerator)
    steps = args.steps if args.steps is not None else (2 if args.quick else 30)
    warm = 1 if args.quick else 3
    names = args.models.split(",") if args.models else list(QUICK_MODELS if args.quick else MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        raise ValueError(f"--models: unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}")
    fronts = [f.strip() for f in args.front_ends.split(",") if f.strip()]
    print(f"ops_per_step on {device_name(device)}", flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as log_root:
        for name in names:
            if "plain" in fronts:
                results.append(plain_scenario(name, device, args.batch_size, steps, warm))
            if "lightning" in fronts:
                results.append(lightning_scenario(name, device, args.batch_size, steps, warm, log_root))
        if "fedavg" in fronts:
            results.append(fedavg_scenario(device, steps, warm, log_root))
    print_table(results)
    payload = {"benchmark": "ops_per_step", "device": device.type, "device_name": device_name(device),
               "quick": args.quick, "batch_size": args.batch_size, "num_canaries": K, "steps": steps,
               "torch_threads": torch.get_num_threads(), "budget": BUDGET, "budget_check": budget_check(results),
               "results": results, "machine": machine_info(), "git": git_state()}
    for key, check in payload["budget_check"].items():
        print(f"budget {key}: +{check['added_at_48_tensors']} ops at 48 tensors, {check['per_tensor']:.2f} "
              f"a further tensor: {'holds' if check['holds'] else 'EXCEEDED'}")
    out = args.output or ("ops_per_step_quick.json" if args.quick else
                          "ops_per_step.json" if device.type == "cpu" else f"ops_per_step_{device.type}.json")
    print(f"wrote {write_json(out, payload)}")
    return payload


if __name__ == "__main__":
    main()

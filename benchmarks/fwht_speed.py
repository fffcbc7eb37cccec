"""Speed of ``audit_callbacks.canary.vectors.fwht`` against the butterfly loop it replaced (issue 28).

    PYTHONPATH=. .venv/bin/python benchmarks/fwht_speed.py              # CPU or CUDA (auto)
    PYTHONPATH=. .venv/bin/python benchmarks/fwht_speed.py --quick      # smoke test, seconds

For each n = 2^m (m = 10 .. 21, and 24) and each batch (one column: how the canary code calls
it; four columns), ``reps`` interleaved pairs run the old loop and the library's ``fwht`` on the
same input in alternating order (old-new, new-old, ...), after one untimed warm-up of each. A
pair's ratio is old / new seconds (above 1: the library is faster); the table gives the median
ratio and its sign-test interval (``median_interval``), and the median times. On CUDA every
call is bracketed by ``torch.cuda.synchronize()``. Each pair also checks that both give the same
transform (float32: within 1e-6 of the norm).

Output: a table on stdout and ``benchmarks/results/fwht_speed.json`` (``fwht_speed_<device>.json``
for a device other than the CPU), with ``machine_info()`` and the device name.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from audit_callbacks.canary.vectors import fwht
from benchmarks._common import (
    add_accelerator_argument,
    device_name,
    git_state,
    machine_info,
    median_interval,
    parser,
    torch_device,
    write_json,
)


def fwht_old(x: torch.Tensor) -> torch.Tensor:
    """The library's ``fwht`` before issue 28 (kept here only for the comparison): log2(n)
    butterfly passes over two buffers of x's size."""
    n = x.shape[0] if x.dim() else 0
    if n < 1 or n & (n - 1):
        raise ValueError(f"fwht needs a leading dimension that is a power of 2, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"fwht needs a floating tensor, got {x.dtype}")
    cur = x.reshape(n, -1).clone()
    nxt = torch.empty_like(cur)
    h = 1
    while h < n:
        a = cur.view(n // (2 * h), 2, h, -1)
        b = nxt.view(n // (2 * h), 2, h, -1)
        torch.add(a[:, 0], a[:, 1], out=b[:, 0])
        torch.sub(a[:, 0], a[:, 1], out=b[:, 1])
        cur, nxt = nxt, cur
        h *= 2
    return cur.view(x.shape)


def timed(fn: Any, x: torch.Tensor) -> tuple[float, torch.Tensor]:
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    y = fn(x)
    sync()
    return time.perf_counter() - start, y


def measure(n: int, cols: int, reps: int, device: torch.device) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(n + cols)
    shape = (n,) if cols == 1 else (n, cols)
    x = torch.randn(shape, generator=gen, device=device)
    timed(fwht_old, x)
    timed(fwht, x)
    old_s, new_s, ratios, errors = [], [], [], []
    for i in range(reps):
        order = (("old", fwht_old), ("new", fwht)) if i % 2 == 0 else (("new", fwht), ("old", fwht_old))
        out = {}
        for name, fn in order:
            out[name] = timed(fn, x)
        old_s.append(out["old"][0])
        new_s.append(out["new"][0])
        ratios.append(out["old"][0] / out["new"][0])
        ref = out["old"][1].double()
        errors.append(float(torch.linalg.vector_norm(out["new"][1].double() - ref) / torch.linalg.vector_norm(ref)))
    if max(errors) > 1e-6:
        raise AssertionError(f"n = {n}, columns = {cols}: the transforms differ by {max(errors):.2e} relative")
    return {
        "n": n, "log2_n": n.bit_length() - 1, "columns": cols, "reps": reps,
        "old_ms_median": 1e3 * statistics.median(old_s), "new_ms_median": 1e3 * statistics.median(new_s),
        "speedup_median": statistics.median(ratios), "speedup_interval": median_interval(ratios),
        "pair_ratios": ratios, "max_relative_difference": max(errors),
    }


def sweep(logs: list[int], reps: int, device: torch.device) -> list[dict[str, Any]]:
    rows = []
    print(f"fwht on {device_name(device)}: old loop / library, {reps} interleaved pairs per row")
    print(f"  {'n':>6} {'cols':>4} {'old ms':>9} {'new ms':>9} {'speedup [interval] (coverage)':>32}")
    for m in logs:
        for cols in (1, 4):
            try:
                row = measure(1 << m, cols, reps, device)
            except torch.OutOfMemoryError:  # 2^24 x 4 columns on a small device
                print(f"  2^{m:<4d} {cols:4d} out of memory: skipped")
                continue
            ci = row["speedup_interval"]
            print(f"  2^{m:<4d} {cols:4d} {row['old_ms_median']:9.3f} {row['new_ms_median']:9.3f} "
                  f"{row['speedup_median']:9.2f}x [{ci['lower']:.2f}, {ci['upper']:.2f}] ({100 * ci['coverage']:.0f}%)",
                  flush=True)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__, quick="a few sizes, 3 pairs each: a smoke test", summary=True)
    add_accelerator_argument(p)
    p.add_argument("--reps", type=int, default=15, help="interleaved pairs per size (default 15)")
    p.add_argument("--max-log2", type=int, default=24, help="largest m tried of n = 2^m (default 24)")
    p.add_argument("--threads", default="0,1",
                        help="comma-separated torch CPU thread counts, one sweep each; 0: torch's default "
                             "(default '0,1': 1 thread is steadier on a shared machine)")
    args = p.parse_args(argv)
    device = torch_device(args.accelerator)  # ValueError for gpu without CUDA
    logs = [10, 12, 14, 16, 17, 18, 19, 20, 21, 24]
    reps = args.reps
    if args.quick:
        logs, reps = [10, 16, 18], 3
    logs = [m for m in logs if m <= args.max_log2]
    default_threads = torch.get_num_threads()
    sweeps = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads or default_threads)
        sweeps.append({"torch_threads": torch.get_num_threads(), "rows": sweep(logs, reps, device)})
    torch.set_num_threads(default_threads)
    name = "fwht_speed.json" if device.type == "cpu" else f"fwht_speed_{device.type}.json"
    if args.quick:
        name = name.replace(".json", "_quick.json")
    path = write_json(name, {
        "benchmark": "fwht_speed", "device": str(device), "device_name": device_name(device),
        "reps": reps, "machine": machine_info(), "git": git_state(), "sweeps": sweeps,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

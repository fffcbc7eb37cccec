"""The benchmarks of audit-callbacks, one package with one runner and one harness.

Run one from the repository root with ``python -m benchmarks NAME [args]`` (``--help`` for its
arguments, ``--quick`` for a smoke test where it has one); ``python -m benchmarks`` lists them.
Each writes ``benchmarks/results/<name>.json`` through :func:`benchmarks._common.write_json`,
with the machine it ran on. Not part of the library.
"""

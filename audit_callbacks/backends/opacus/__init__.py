"""Opacus DP-SGD glue (torch + Opacus, no Lightning).

* :mod:`.optimizer` - find the run's ``DPOptimizer`` and its accountant; chain the step hook;
* :mod:`.accounting` - the analytic epsilon of a canary from the accountant's history;
* :mod:`.placement` - where gradient canaries enter (before or after clipping, which rank);
* :mod:`.injector` - :class:`GradientCanaryInjector`, canaries as rows before Opacus' clipping;
* :mod:`.sampling` - canaries drawn by the training loader's own Poisson sampler;
* :mod:`.buffers` - flat parameter buffers gathered by one op;
* :mod:`.backend` - :class:`OpacusBackend`, what the auditor sees of an Opacus run.
"""

"""Every canary statistic, on the model's device, owned by the one
:class:`~audit_callbacks.auditing.CanaryAuditor`:

* :mod:`.vectors` - the canary vectors (Gaussian or Hadamard);
* :mod:`.projection` - one projection of each released vector onto the canaries (one transform
  for Hadamard canaries, the buffered blocks for Gaussian ones), shared by every statistic;
* :mod:`.base` - the interface every statistic implements (fold, scores, estimate, state), the
  descriptions of what one release is, and the registration of the statistics built from them;
* :mod:`.statistics` - the final-model and max-cosine statistics;
* :mod:`.known_rounds` - the all-iterates statistic of DP-FedAvg when the rounds are known;
* :mod:`.steps_unknown` - the all-iterates statistic of DP-SGD when the steps are unknown.
"""

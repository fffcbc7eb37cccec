"""Every canary statistic, on the model's device: the canary vectors (:mod:`.vectors`), the
final-model and max-cosine statistics (:mod:`.statistics`), the known-rounds statistic
(:mod:`.known_rounds`) and the steps-unknown statistic (:mod:`.steps_unknown`)."""

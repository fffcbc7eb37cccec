"""What the replies of a Flower round go through before the wrapped strategy aggregates them:
the canary clients' updates clipped by the training's own clipping, the client weights
(``num-examples``) checked, and each round's effective noise multiplier.

**Clipping path** (:func:`clipping_path`), from the first Flower central-DP wrapper in the
chain (``.strategy`` links):

* ``"server"``: a server-side wrapper (``DifferentialPrivacyServerSide{Fixed,Adaptive}
  Clipping``, or a subclass): the canary replies go into its ``aggregate_train`` with the real
  ones and its own clipping (``compute_clip_model_update``) acts on them;
* ``"client"``: a client-side wrapper: the real clients clip in Flower's ``fixedclipping_mod``
  (``adaptiveclipping_mod``) with the clip norm the wrapper writes into their instruction; each
  canary reply is passed through that same mod, on the canary's own instruction;
* ``"audit"``: no Flower DP wrapper (``noise_multiplier`` and ``clip_norm`` given to
  ``CanaryStrategy``): nothing clips the real replies, so the canary update is clipped at
  ``clip_norm`` by Flower's ``clip_inputs_inplace`` (the function both wrappers use), with a
  logged reason.

Sources: Flower 1.41 ``flwr/serverapp/strategy/dp_fixed_clipping.py``,
``flwr/clientapp/mod/centraldp_mods.py``, ``flwr/supercore/differential_privacy.py``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.app import Context, Message, RecordDict
from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
)
from flwr.supercore.differential_privacy import clip_inputs_inplace

__all__ = ["clip_canary_replies", "clip_update", "clipping_path", "reply_weight"]

_SERVER = (DifferentialPrivacyServerSideFixedClipping, DifferentialPrivacyServerSideAdaptiveClipping)
_CLIENT = {DifferentialPrivacyClientSideFixedClipping: fixedclipping_mod,
           DifferentialPrivacyClientSideAdaptiveClipping: adaptiveclipping_mod}


def clipping_path(strategy: Any) -> tuple[str, Any, str]:
    """``(path, wrapper, reason)``: ``"server"``, ``"client"`` or ``"audit"`` (see the
    module docstring), the DP wrapper found (None for ``"audit"``) and what the summary says."""
    seen = 0
    while strategy is not None and seen < 16:
        if isinstance(strategy, _SERVER):
            return "server", strategy, f"the DP wrapper's server-side clipping ({type(strategy).__name__})"
        for cls in _CLIENT:
            if isinstance(strategy, cls):
                return "client", strategy, (f"Flower's {_CLIENT[cls].__name__}, as the clients "
                                            f"of {type(strategy).__name__} clip")
        strategy, seen = getattr(strategy, "strategy", None), seen + 1
    return "audit", None, ("no Flower DP wrapper clips the replies: canary updates clipped at "
                           "clip_norm by Flower's clip_inputs_inplace")


def clip_update(update: np.ndarray, clip_norm: float) -> np.ndarray:
    """``update`` ``[b, d]`` with each row clipped to L2 norm ``clip_norm`` by Flower's own
    ``clip_inputs_inplace`` (FlatClip, McMahan et al. 2018), float32."""
    out = np.array(update, dtype=np.float32, copy=True)
    for row in out:
        clip_inputs_inplace([row], float(clip_norm))
    return out


def clip_canary_replies(replies: list[tuple[Message, Message]], wrapper: Any) -> list[Message]:
    """Each ``(reply, instruction)`` of a canary client: the reply passed through the
    client-side clipping mod the clients of ``wrapper`` run, with the clip norm the canary's
    instruction carries (what the wrapper told the cohort).

    Raises:
        ValueError: the mod answered with an error (e.g. the instruction has no clip norm).
    """
    mod = next(m for cls, m in _CLIENT.items() if isinstance(wrapper, cls))
    context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={})
    out = []
    for reply, instruction in replies:
        clipped = mod(instruction, context, lambda msg, ctx, reply=reply: reply)
        if clipped.has_error():
            raise ValueError(f"{mod.__name__} refused a canary reply: {clipped.error.reason}")
        out.append(clipped)
    return out


def reply_weight(msg: Message, key: str) -> tuple[float | None, str | None]:
    """``(weight, problem)``: the reply's ``key`` in its first MetricRecord (what FedAvg weighs
    it by), and why it cannot weigh a reply (NaN, inf, negative), or None. A missing or
    non-numeric key gives ``(None, None)``: Flower's own checks refuse the round."""
    metrics = next(iter(msg.content.metric_records.values()), None)
    value = None if metrics is None else metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, None
    value = float(value)
    if not math.isfinite(value):
        return None, f"{key} = {value} is not finite"
    if value < 0:
        return None, f"{key} = {value} is negative"
    return value, None

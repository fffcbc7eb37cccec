"""``LocalGrid``: a Flower ``Grid`` whose nodes are Python functions in this process.

It runs a Message API strategy's ``start`` loop (sampling, DP wrappers, aggregation: all
Flower's own code) without a SuperLink, a network or Ray: for tests, the cross-check against
:class:`~audit_callbacks.federated.DPFedAvg` and the overhead benchmark. The multi-process test
(``tests/flower/test_flower_deployment.py``) and the example use Flower's real runtimes.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from audit_callbacks.validation import check_count

__all__ = ["LocalGrid", "NodeHandler"]

#: ``handler(message, node_index) -> RecordDict``: node ``node_index`` (0..num_nodes-1) answers
#: ``message``; an exception becomes an error reply (a Flower "failure").
NodeHandler = Callable[[Message, int], RecordDict]


class LocalGrid(Grid):
    """``num_nodes`` in-process nodes with ids ``1..num_nodes``.

    Args:
        num_nodes: the connected nodes.
        handler: see :data:`NodeHandler`.

    Messages need a task identity outside a Flower runtime: it is set (run 1, node 0,
    task 1) unless one is already set.

    Raises:
        ValueError: ``num_nodes`` not an integer >= 1, or ``handler`` not callable.
    """

    def __init__(self, num_nodes: int, handler: NodeHandler) -> None:
        self.num_nodes = check_count(num_nodes, "num_nodes", minimum=1)
        if not callable(handler):
            raise ValueError(f"handler must be a callable (message, node_index) -> RecordDict, got "
                             f"{type(handler).__name__}")
        self.handler = handler
        self.sent: list[int] = []  # destination node ids, in order
        for name, value in (("run_id", 1), ("node_id", 0), ("task_id", 1)):
            if getattr(TaskIdentity, f"_{name}") is None:
                setattr(TaskIdentity, name, value)
        self._run: Any = None

    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(range(1, self.num_nodes + 1))

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError("LocalGrid answers in send_and_receive")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError("LocalGrid answers in send_and_receive")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None
                         ) -> Iterable[Message]:
        replies = []
        for msg in messages:
            node = int(msg.metadata.dst_node_id)
            if not 1 <= node <= self.num_nodes:
                raise ValueError(f"LocalGrid: no node {node}")
            self.sent.append(node)
            try:
                replies.append(Message(self.handler(msg, node - 1), reply_to=msg))
            except Exception as err:  # noqa: BLE001 - a client's failure is a reply, as in Flower
                reason = "".join(traceback.format_exception_only(type(err), err)).strip()
                replies.append(Message(Error(code=1, reason=reason), reply_to=msg))
        return replies

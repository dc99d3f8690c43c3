"""At most K services rolling at once for template changes the user did not ask for (core/rollout.py says
which those are). Reconciles run on several threads, so admission is one atomic step here: a reconcile that
would roll its servers out asks `admit` before it writes; refused, it leaves the Deployment as it is, and the
service waits in line until a rollout ends (`observe` sees its Deployment finished) and `to_wake` hands it back
to the dispatcher.

What holds a slot: the rollouts admitted here and not yet seen finished (their new pods available), and nothing
else. A user's own rollout takes none: one tenant editing its services every minute does not hold back another's
paced rollouts. (So after an operator restart the rollouts the last process admitted are not counted: for one
rollout's time, up to twice the limit may roll.) Slots are shared by namespace: while services of several
namespaces want them, a namespace holds at most its share (the limit over the namespaces rolling or waiting,
rounded up), and the services in line are woken oldest first among the namespaces below their share.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from cpullm.core.rollout import rollout_finished

log = logging.getLogger(__name__)

ServiceKey = tuple[str, str]  # namespace, name


class RolloutPacer:
    def __init__(self, limit: int | None) -> None:
        """`limit`: services rolling at once (None: no limit)."""
        self.limit = limit
        self._lock = threading.Lock()
        self._admitted: dict[ServiceKey, int | None] = {}  # the Deployment generation its rollout must reach
        self._waiting: dict[ServiceKey, bool] = {}  # in line, oldest first; True: handed back, not yet reconciled

    def admit(self, key: ServiceKey) -> bool:
        """Whether `key` may roll out now (it then holds a slot until `observe` sees it finished); if not, it
        waits in line."""
        with self._lock:
            busy = set(self._admitted) - {key}
            if self.limit is None or key in self._admitted or (len(busy) < self.limit and self._below_share(key, busy)):
                self._admitted.setdefault(key, None)
                self._waiting.pop(key, None)
                return True
            self._waiting[key] = False
            shown = ", ".join("/".join(k) for k in sorted(busy)[:10])
            log.info("%s/%s waits for a rollout slot; rolling: %s", *key, shown)
            return False

    def started(self, key: ServiceKey, generation: int) -> None:
        """The admitted rollout was written: it is over once the Deployment observed `generation` and finished."""
        with self._lock:
            if key in self._admitted:
                self._admitted[key] = generation

    def settled(self, key: ServiceKey) -> None:
        """A reconcile of `key` needed no slot (nothing to roll, or a change the user asked for): out of line,
        and a slot admitted but never written is freed."""
        with self._lock:
            self._waiting.pop(key, None)
            if self._admitted.get(key, 0) is None:
                del self._admitted[key]

    def observe(self, key: ServiceKey, deployment: Mapping[str, Any] | None) -> None:
        """The servers' Deployment as a watch event shows it (None: deleted): a finished rollout frees its slot."""
        with self._lock:
            generation = self._admitted.get(key)
            if generation is None:
                return
            if deployment is None or (
                int((deployment.get("status") or {}).get("observedGeneration") or 0) >= generation
                and rollout_finished(deployment)
            ):
                del self._admitted[key]

    def anyone_waiting(self) -> bool:
        with self._lock:
            return bool(self._waiting)

    def waiting(self, key: ServiceKey) -> bool:
        """Whether `key` waits in line for a slot."""
        with self._lock:
            return key in self._waiting

    def forget(self, key: ServiceKey) -> None:
        """The service is gone."""
        with self._lock:
            self._admitted.pop(key, None)
            self._waiting.pop(key, None)

    def to_wake(self) -> list[ServiceKey]:
        """The services in line to reconcile again, as many as there are free slots (each handed back once until
        its reconcile answers)."""
        with self._lock:
            if self.limit is None:
                return []
            busy = set(self._admitted) | {key for key, handed in self._waiting.items() if handed}
            woken: list[ServiceKey] = []
            for key, handed in list(self._waiting.items()):
                if len(busy) >= self.limit:
                    break
                if not handed and self._below_share(key, busy):
                    woken.append(key)
                    busy.add(key)
                    self._waiting[key] = True
            return woken

    def _below_share(self, key: ServiceKey, busy: set[ServiceKey]) -> bool:
        """Whether `key`'s namespace holds fewer slots than its share: the limit over the namespaces that hold or
        wait for one (key's among them), rounded up. A namespace alone may take every slot."""
        assert self.limit is not None
        namespaces = {k[0] for k in busy} | {k[0] for k in self._waiting} | {key[0]}
        share = -(-self.limit // len(namespaces))
        return sum(1 for k in busy if k[0] == key[0]) < share

"""HAVING: a selection over the aggregate's output (DESIGN §7).

Delta rule: as for σ. The aggregate emits ``(old row, P_old, −1)`` and ``(new row, P_new, +1)``
for a touched group; HAVING passes each of them independently, so a group entering the result
emits only ``+new``, one leaving it only ``−old``. Stateless.
"""

from __future__ import annotations

from sketches.ivm.ops.select import Select


class Having(Select):
    kind = "having"

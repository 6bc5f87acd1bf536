"""``--isolate cmd:PATH``: the operator's own executable, given the node and the diagnosis.

Run as ``PATH NODE DIAGNOSIS_JSON`` with the same JSON on stdin (argv is capped at
96 KiB, under Linux's 128 KiB per-argument limit: a longer diagnosis keeps its stacks on
stdin only). Never through a shell: PATH is executed directly, so a script needs its own
``#!`` line. PATH is resolved when ``c4d run`` starts, so a relative path means relative
to where it was started, and a missing or non-executable file is refused then.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from c4d.actions.base import Command, compact_json
from c4d.actions.node_name import check

ARGV_LIMIT = 96 * 1024


class CommandAction:
    def __init__(self, path: str):
        self.path = path
        self.name = f"cmd:{path}"

    @classmethod
    def from_spec(cls, spec: str) -> CommandAction:
        if not spec:
            raise ValueError("--isolate cmd:PATH needs a PATH")
        p = Path(spec).expanduser()
        if not p.is_file():
            raise ValueError(f"--isolate cmd:{spec}: no such file")
        if not os.access(p, os.X_OK):
            raise ValueError(f"--isolate cmd:{spec}: not executable")
        return cls(os.path.abspath(p))

    def commands(self, node: str, diagnosis: Mapping[str, Any]) -> list[Command]:
        node = check(node)
        full = json.dumps(diagnosis, sort_keys=True)
        return [Command((self.path, node, compact_json(diagnosis, ARGV_LIMIT)), stdin=full + "\n")]

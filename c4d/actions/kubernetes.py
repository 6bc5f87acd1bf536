"""``--isolate kubernetes``: cordon the node and taint it, with the diagnosis as an annotation.

``kubectl cordon`` marks the node unschedulable; the taint ``c4d.io/isolated=<kind>:NoSchedule``
says why in a form a scheduler or an admission policy can select on; the annotation
``c4d.io/diagnosis`` carries the diagnosis JSON (the evidence; capped well below the API
server's 256 KiB annotation limit). All three are idempotent on the Kubernetes side too
(``--overwrite``; cordoning a cordoned node is a no-op). kubectl uses its own configuration
(``KUBECONFIG``, in-cluster service account).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from c4d.actions.base import Command, compact_json
from c4d.actions.node_name import check

TAINT_KEY = "c4d.io/isolated"
ANNOTATION = "c4d.io/diagnosis"
ANNOTATION_LIMIT = 128 * 1024


def _label_value(text: str) -> str:
    """A valid label/taint value: ≤ 63 of [A-Za-z0-9_.-], alphanumeric at both ends."""
    v = re.sub(r"[^A-Za-z0-9_.-]", "", text)[:63].strip("_.-")
    return v or "unknown"


class Kubernetes:
    name = "kubernetes"

    def __init__(self, kubectl: str = "kubectl"):
        self.kubectl = kubectl

    def commands(self, node: str, diagnosis: Mapping[str, Any]) -> list[Command]:
        node = check(node)
        kind = _label_value(str(diagnosis.get("kind", "")))
        return [
            Command((self.kubectl, "cordon", node)),
            Command((self.kubectl, "taint", "nodes", node, f"{TAINT_KEY}={kind}:NoSchedule", "--overwrite")),
            Command(
                (
                    self.kubectl,
                    "annotate",
                    "nodes",
                    node,
                    "--overwrite",
                    f"{ANNOTATION}={compact_json(diagnosis, ANNOTATION_LIMIT)}",
                )
            ),
        ]

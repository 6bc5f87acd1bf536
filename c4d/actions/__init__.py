"""Actions taken on a localized ERROR diagnosis (DESIGN.md: blacklist the culprit node).

``blacklist`` is the file the master and ``c4d run`` keep; ``isolate`` runs the external
ones (``kubernetes``, ``slurm``, ``command``) for ``c4d run --isolate``.
"""

from c4d.actions.blacklist import append_nodes, apply, read_nodes

__all__ = ["append_nodes", "apply", "read_nodes"]

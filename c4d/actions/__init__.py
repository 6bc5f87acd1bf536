"""Actions taken on a localized ERROR diagnosis (docs/design.md: blacklist the culprit node).

``blacklist`` is the file the master and ``c4d run`` keep; the external ones (``kubernetes``,
``slurm``, ``command``) build on ``base`` (what an action is), ``factory`` makes them from
``--isolate`` values, and ``isolate`` runs them for ``c4d run --isolate``.
Imports ``c4d.record`` and ``c4d.util`` only.
"""

from c4d.actions.blacklist import append_nodes, apply, read_nodes

__all__ = ["append_nodes", "apply", "read_nodes"]

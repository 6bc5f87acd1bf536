"""Actions taken on a localized ERROR diagnosis (DESIGN.md: blacklist the culprit node).

Richer actions (Kubernetes cordon, Slurm drain, job restart) are their own issue; they
will sit beside ``blacklist`` and take the same Diagnosis.
"""

from c4d.actions.blacklist import append_nodes, apply, read_nodes

__all__ = ["append_nodes", "apply", "read_nodes"]

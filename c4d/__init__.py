"""c4d: find the rank, node or link that makes an NCCL job hang or crawl."""

from c4d.phase import hang_timeout

__version__ = "0.1.0"
__all__ = ["__version__", "hang_timeout"]

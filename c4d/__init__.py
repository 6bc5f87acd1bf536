"""c4d: find the rank, node or link that makes an NCCL job hang or crawl."""

__version__ = "0.1.0"

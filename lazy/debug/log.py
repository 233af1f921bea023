"""The LAZY_DEBUG logging ladder: 1 syncs, 2 compiles and cache misses, 3 graph text, 4 every traced op."""
from __future__ import annotations

import os
import sys

from ..config import config


def enabled(level: int) -> bool:
    return config.debug >= level


def log(level: int, message: str) -> None:
    if config.debug >= level:
        print(f"[lazy:{level}] {message}", file=sys.stderr)


_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH = os.path.dirname(os.path.abspath(__import__("torch").__file__))


def topic_enabled(topic: str) -> bool:
    """Whether ``topic`` is among LAZY_LOGS's comma-separated topics (``all`` enables every topic)."""
    topics = config.logs
    return bool(topics) and (topic in topics.split(",") or topics.strip() == "all")


def log_topic(topic: str, message: str) -> None:
    """A topic log (LAZY_LOGS=graph_breaks,recompiles,...), in the TORCH_LOGS habit."""
    if topic_enabled(topic):
        print(f"[lazy:{topic}] {message}", file=sys.stderr)


_LIBRARY_FILES: dict = {}  # co_filename -> whether it is lazy's, torch's or frozen (every sync asks: no abspath each)


def _library_file(name: str) -> bool:
    known = _LIBRARY_FILES.get(name)
    if known is None:
        path = os.path.abspath(name)
        known = _LIBRARY_FILES[name] = path.startswith(_HERE) or path.startswith(_TORCH) or "<frozen" in path
    return known


def user_frame() -> str:
    """``file:line (function)`` of the first caller outside lazy/ and torch/: where the user caused this."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if not _library_file(code.co_filename):
            return f"{code.co_filename}:{frame.f_lineno} ({code.co_name})"
        frame = frame.f_back
    return "<unknown>"

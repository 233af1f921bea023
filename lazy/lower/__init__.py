"""Lowering: a linearized ATen graph -> loop-level kernel IR (kir) and extern calls. See graph.lower."""
from .graph import Extern, Lowered, Store, lower  # noqa: F401

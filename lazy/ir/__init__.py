"""The IR: one immutable node type (see node.py) and graph walks over it (see graph.py)."""
from .node import DATA, GETITEM, Node, Op, data_leaf, getitem

__all__ = ["DATA", "GETITEM", "Node", "Op", "data_leaf", "getitem"]

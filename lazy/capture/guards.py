"""An entry's guards as a C program (csrc/capture_guards.cpp, Note [Guard programs]).

``compile_guards(state, guards)`` translates the global-state guard and every guard whose expression is a chain of
loads (an argument, an object the capture holds, attributes, items at constant keys or at keys that are themselves
chains of loads), Python's binary operators over such chains and numbers, and builtins such as ``len`` of one
(Note [Arithmetic in guard programs]) into one ``GuardProgram``; the guards it cannot express (other calls and
operators) come back as the residual, which the entry checks
with its Python renderer after the program holds. Both answer exactly what the Python check answers (the tests hold
them to it, guard kind by guard kind).
"""
from __future__ import annotations

import sys
import types
from typing import Any, Dict, List, Optional, Tuple

import torch

from .. import _C
from ..device.tensor import LazyTensor
from .expr import E

# The instruction set, in the order of csrc/capture_guards.cpp's enum Op.
OPS = ("arg", "const", "attr", "item", "is", "type_is", "eq", "truth", "is_none", "len", "absent", "has_attr",
       "call_eq", "keys", "lazy_tensor", "state", "item_reg", "host_tensor", "binary",
       "call", "is_reg", "method_is", "grad_is_none")
OP = {name: i for i, name in enumerate(OPS)}
# Python's operators the program computes, in the order of csrc/capture_guards.cpp's enum Binary (Note [Arithmetic
# in guard programs])
BINARY = {op: i for i, op in enumerate(("+", "-", "*", "/", "//", "%", "<", "<=", ">", ">=", "==", "!=", "in",
                                        "not in"))}
# Functions a program calls on one loaded value (the Python check calls the same): builtins without side effects
CALLS = (len, abs, bool, int, float, type)

Guard = Tuple[str, E, Any]


class _Builder:
    def __init__(self) -> None:
        self.code: List[tuple] = []
        self.regs: Dict[E, int] = {}

    def emit(self, op: str, dst: int = -1, src: int = -1, n: int = 0, a: Any = None, b: Any = None) -> None:
        self.code.append((OP[op], dst, src, n, a, b))

    def attempt(self, build: Any) -> Any:
        """``build()``'s result, or None having dropped the instructions it emitted (the loads of a guard or a
        value the program cannot finish go with it)."""
        mark, regs = len(self.code), dict(self.regs)
        result = build()
        if result is None or result is False:
            del self.code[mark:]
            self.regs = regs
            return None
        return result

    def program(self, *outputs: Any) -> Any:
        nregs = 1 + max((ins[1] for ins in self.code), default=-1)
        return _C.guard_program(self.code, nregs, LazyTensor, torch.nn.Module, *outputs)

    def load(self, e: Any) -> Optional[int]:
        """The register holding ``e``'s value (loaded once per call), or None where ``e`` is not a chain of loads."""
        if type(e) is not E:
            return None
        r = self.regs.get(e)
        if r is not None:
            return r
        op, args = e.op, e.args
        if op == "item" and type(args[1]) is E:  # a key that is itself loaded: optimizer.state[param]
            src, key = self.load(args[0]), self.load(args[1])
            if src is None or key is None:
                return None
            r = len(self.regs)
            self.emit("item_reg", r, src, n=key)
        elif op == "attr" or op == "item":
            src = self.load(args[0])
            if src is None:
                return None
            r = len(self.regs)
            self.emit(op, r, src, a=sys.intern(args[1]) if op == "attr" else args[1])
        elif op in ("bin", "cmp") and args[0] in BINARY:
            left, right = self.operand(args[1]), self.operand(args[2])
            if left is None or right is None:
                return None
            r = len(self.regs)
            self.emit("binary", r, left, n=right, a=BINARY[args[0]])
        elif op == "call" and len(args[1]) == 1 and not args[2] and any(_function(args[0]) is f for f in CALLS):
            src = self.operand(args[1][0])
            if src is None:
                return None
            r = len(self.regs)
            self.emit("call", r, src, a=_function(args[0]))
        elif op == "arg":
            r = len(self.regs)
            self.emit("arg", r, n=args[0])
        elif op == "obj":
            r = len(self.regs)
            self.emit("const", r, a=args[0])
        else:
            return None
        self.regs[e] = r
        return r

    def operand(self, x: Any) -> Optional[int]:
        """The register of an operator's operand: an expression's, or a constant's (held by the program, as the
        Python check's constants are)."""
        return self.load(x if type(x) is E else E("obj", x))

    def guard(self, kind: str, e: E, expected: Any, tensor_signature: Any) -> bool:
        if kind == "id" and isinstance(expected, types.FunctionType) and e.op == "attr" and e.args[1] == "__func__" \
                and type(e.args[0]) is E and e.args[0].op == "attr":  # Note [Method guards] (guard_reads.cpp)
            obj = self.load(e.args[0].args[0])
            if obj is None:
                return False
            self.emit("method_is", src=obj, a=sys.intern(e.args[0].args[1]), b=expected)
            return True
        if kind == "isnone" and e.op == "attr" and e.args[1] == "grad":  # Note [Gradients in guard programs]
            tensor = self.load(e.args[0])
            if tensor is None:
                return False
            self.emit("grad_is_none", src=tensor, n=int(bool(expected)), a=torch._C._disabled_torch_function_impl,
                      b=torch._C.TensorBase.__dict__["grad"])
            return True
        src = self.load(e)
        if src is None:
            return False
        if kind == "id" or kind == "eq" and isinstance(expected, torch.Tensor):
            self.emit("is", src=src, a=expected)
        elif kind == "same":
            other = self.load(expected)
            if other is None:
                return False
            self.emit("is_reg", src=src, n=other)
        elif kind == "type":
            self.emit("type_is", src=src, a=expected)
        elif kind == "eq":
            self.emit("eq", src=src, a=expected, b=type(expected))
        elif kind == "truth":
            self.emit("truth", src=src, n=int(bool(expected)))
        elif kind == "isnone":
            self.emit("is_none", src=src, n=int(bool(expected)))
        elif kind == "len":
            self.emit("len", src=src, n=expected)
        elif kind == "keys":
            self.emit("keys", src=src, a=torch.Tensor, b=tuple(expected))  # Note [Key guards in C]
        elif kind == "tensor" and type(expected) is tuple and expected and expected[0] == "lazy":
            self.emit("lazy_tensor", src=src, b=expected)
        elif kind == "tensor" and type(expected) is tuple and len(expected) == 7 and expected[0] == "host":
            device = expected[5]
            self.emit("host_tensor", src=src, b=expected,
                      a=(device.type, device.index if device.index is not None else -1, tensor_signature))
        elif kind == "tensor":
            self.emit("call_eq", src=src, a=tensor_signature, b=expected)
        elif kind == "absent":
            self.emit("absent", src=src, a=expected)
        elif kind == "noattr":
            self.emit("has_attr", src=src, a=sys.intern(expected), n=0)
        elif kind == "hasattr":
            self.emit("has_attr", src=src, a=sys.intern(expected[0]), n=int(bool(expected[1])))
        else:
            return False
        return True


def _function(f: Any) -> Any:
    """The function a call expression calls, where it is a constant (held by the capture); else None."""
    if type(f) is E:
        return f.args[0] if f.op == "obj" else None
    return f


def compile_guards(state: tuple, guards: List[Guard], state_calls: tuple,
                   tensor_signature: Any) -> Tuple[Any, List[Guard]]:
    """(program, residual): the program checks the global state (``state``: grad mode, inference mode, then the
    values of ``state_calls``, as python_guards.global_state() reads them) and every guard it can express; the residual
    lists the others, in their order."""
    b = _Builder()
    b.emit("state", a=tuple(state_calls), b=state)
    residual = []
    for kind, e, expected in guards:
        if b.attempt(lambda: b.guard(kind, e, expected, tensor_signature)) is None:
            residual.append((kind, e, expected))
    return b.program(), residual


def compile_loads(exprs: List[E]) -> Tuple[Any, List[int]]:
    """Note [Replay loads in C]: (program, which): a program returning, as a tuple, the values of those of ``exprs``
    the guard instructions can load (positions ``which``), or (None, []) if none can."""
    b = _Builder()
    outputs, which = [], []
    for k, e in enumerate(exprs):
        r = b.attempt(lambda: b.load(e))
        if r is not None:
            outputs.append(r)
            which.append(k)
    if not which:
        return None, []
    return b.program(tuple(outputs)), which


def tensor_signature(t: Any) -> tuple:
    """What a guard on a tensor compares: the metadata the recorded graph depends on."""
    if isinstance(t, LazyTensor):
        return ("lazy", t._lz_desc, t.requires_grad, t._lz_chain is not None, t._lz_st.numel)
    if isinstance(t, torch.Tensor):
        return ("host", tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype, t.device, t.requires_grad)
    return ("none",) if t is None else ("other", type(t))

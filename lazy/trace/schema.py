"""What the recorder needs to know about an ATen overload, derived once from its schema and tags.

Note [Functional variants]
The IR is functional (Note [IR values are logical]): an in-place op ``foo_`` or an ``out=`` op is recorded as
its functional variant, and the tensors it mutates get the variant's results as new values. The variant is
found by schema matching, following the conventions of PyTorch's functionalization: it takes the same
arguments (minus ``out=``), and returns the mutable op's non-aliased returns followed by the new values of
the mutated arguments. An op without such a variant is recorded as itself, wrapped so that the executor runs
it on copies of the mutated arguments (``functionalized_call``).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

aten = torch.ops.aten

# Runtime-scalar kinds of a Python number passed for a schema argument (see Note [Argument templates]).
STATIC = 0  # part of the graph key: ints that decide shapes, flags, dims
RUNTIME = 1  # a runtime input: Scalar arguments (alpha, fill values, learning rates)
RUNTIME_MEMO_VALUE = 2  # a runtime input whose value still keys the shape memo: `float` arguments

# Ops whose Scalar arguments decide the output shape: their numbers are static.
SHAPE_SCALAR_OPS = frozenset(
    getattr(aten, name) for name in ("arange", "range"))

# Note [Scalars that pick eager's kernel]
# Eager's pow.Tensor_Scalar runs a different kernel for some exponents (ATen's pow_tensor_scalar_kernel: 2 and 3 as
# multiplications, 0.5 and -0.5 as square roots, -1 and -2 as reciprocals), each rounding as its arithmetic does. A
# runtime exponent would leave a compiled kernel a libm pow per element (20-40 ns: GELU's tanh form, pow(x, 3.0),
# took 0.5 ms of a GPT-2 training step) and eager's rounding only by a branch. The exponent is static instead: its
# value is in the graph key, so the kernel (C++ or Triton) is eager's arithmetic for that exponent, vectorized; a
# loop that varies the exponent compiles once per value (as torch.compile specializes a float exponent too).
SCALAR_KERNEL_ARGS = {aten.pow: ("exponent",), aten.pow_: ("exponent",)}

# Ops that return a view although their schema says nothing aliases: kron writes its result through
# _unsafe_view(out), so recording it as a new value lost the write.
UNDECLARED_VIEWS = frozenset((aten._unsafe_view.default,))

# Schemas that mutate arguments without saying so: op -> positions of the mutated arguments.
UNDECLARED_MUTATIONS = {aten.native_batch_norm.default: (3, 4), aten.native_batch_norm.out: (3, 4)}


# Note [Random ops that draw nothing]
# A random op without a generator argument is recorded as a seeded op (Note [The seed of a seeded op] in
# lazy/ir/ops.py), which must run on the calling thread (Note [Seeded ops run on the calling thread] in
# lazy/sync/launch.py). But attention kernels with ``dropout_p == 0`` and dropout with ``train=False`` draw
# nothing from any generator: eager's results do not depend on it and eager's generator does not advance. Such a
# call is recorded as the plain op, so a graph holding attention without dropout (every call of
# F.scaled_dot_product_attention without dropout_p, and any in eval mode) launches asynchronously, and recording it
# draws no seed, as eager draws none. The argument that decides, by name, with its drawing-nothing value. (A
# native_dropout with p == 0 and train=True still draws in eager: bernoulli_(1.0).)
NO_DRAW = {"dropout_p": 0.0, "train": False}


class OpDesc:
    """The recorder's view of one overload."""

    __slots__ = ("op", "name", "kinds", "kw_kinds", "kind", "mutated", "out_names", "aliased_returns",
                 "functional", "num_returns", "random", "has_generator", "data_dependent", "dynamic_shape",
                 "view_multi", "return_sources", "arg_names", "pad_args", "draws_unless")

    def __init__(self, op: torch._ops.OpOverload) -> None:
        schema = op._schema
        self.op = op
        self.name = str(op)
        static_all = op.overloadpacket in SHAPE_SCALAR_OPS
        static_names = SCALAR_KERNEL_ARGS.get(op.overloadpacket, ())
        self.kinds: List[int] = []
        self.kw_kinds: Dict[str, int] = {}
        self.mutated: List[int] = []
        self.out_names: List[str] = []
        self.has_generator = False
        for i, arg in enumerate(schema.arguments):
            kind = STATIC if static_all or (arg.name in static_names and str(arg.type) == "number") else \
                _scalar_kind(str(arg.type))
            if arg.kwarg_only:
                self.kw_kinds[arg.name] = kind
            else:
                self.kinds.append(kind)
            if arg.name == "generator":
                self.has_generator = True
            if arg.alias_info is not None and arg.alias_info.is_write:
                # ATen's convention: mutable keyword-only arguments are out= tensors (torch < 2.12 has no Tag.out).
                if arg.kwarg_only:
                    self.out_names.append(arg.name)
                else:
                    self.mutated.append(i)
        self.mutated.extend(UNDECLARED_MUTATIONS.get(op, ()))
        self.arg_names = [a.name for a in schema.arguments]
        # For each return: the index of the argument it aliases (in-place and out= ops), or None.
        sets = {i: a.alias_info.before_set for i, a in enumerate(schema.arguments) if a.alias_info is not None}
        self.return_sources = tuple(
            next((i for i, s in sets.items() if r.alias_info is not None and s == r.alias_info.before_set), None)
            for r in schema.returns)
        self.num_returns = len(schema.returns)
        self.aliased_returns = tuple(r.alias_info is not None for r in schema.returns)
        tags = op.tags
        self.random = torch.Tag.nondeterministic_seeded in tags
        # Note [Random ops that draw nothing]: (index, name, default, the value with which the op draws nothing)
        self.draws_unless = next(((i, a.name, a.default_value if a.has_default_value() else None, NO_DRAW[a.name])
                                  for i, a in enumerate(schema.arguments) if a.name in NO_DRAW), None) \
            if self.random and not self.has_generator else None
        self.data_dependent = torch.Tag.data_dependent_output in tags
        self.dynamic_shape = torch.Tag.dynamic_output_shape in tags
        is_view = (not self.mutated and not self.out_names
                   and any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
                   or op in UNDECLARED_VIEWS)
        self.view_multi = is_view and str(schema.returns[0].type).startswith("List")
        if torch.Tag.inplace_view in tags:  # squeeze_, transpose_, as_strided_, resize_: new metadata for self
            self.kind = "inplace_view"
        elif is_view:
            self.kind = "view"
        elif self.out_names:
            self.kind = "out"
        elif self.mutated:
            self.kind = "inplace"
        else:
            self.kind = "functional"
        self.functional = _find_functional(op, self) if self.kind in ("out", "inplace", "inplace_view") else None
        self.pad_args = _pad_args(schema, self.functional)

    def __repr__(self) -> str:
        return f"OpDesc({self.name}, {self.kind})"


def _pad_args(schema: Any, functional: Optional[torch._ops.OpOverload]) -> Optional[tuple]:
    """The mutable op's positional defaults when its functional variant lacks some of them (``bernoulli_.float``
    defaults ``p=0.5``, ``bernoulli.p`` does not): calls that omit them are padded before recording; else None."""
    if functional is None:
        return None
    fargs = functional._schema.arguments
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if not any(a.has_default_value() and not f.has_default_value() for a, f in zip(positional, fargs)):
        return None
    return tuple(a.default_value if a.has_default_value() else None for a in positional)


def _scalar_kind(type_str: str) -> int:
    # A Python number passed for a Tensor argument (``x * 2.5`` is mul.Tensor) is a wrapped scalar: runtime too.
    if type_str in ("number", "Optional[number]", "List[number]", "Tensor", "Optional[Tensor]"):
        return RUNTIME
    if type_str in ("float", "Optional[float]"):
        return RUNTIME_MEMO_VALUE
    return STATIC


def _signature(schema: Any, skip: Tuple[str, ...] = ()) -> tuple:
    """Argument names and types, ignoring alias annotations and the named arguments in ``skip``."""
    return tuple((a.name, str(a.type)) for a in schema.arguments if a.name not in skip)


def _find_functional(op: torch._ops.OpOverload, desc: OpDesc) -> Optional[torch._ops.OpOverload]:
    if desc.out_names and desc.mutated:
        # An out= op that also updates inputs (native_batch_norm.out's running stats): recorded as itself, run on
        # copies (no functional variant returns both; and outside training the cpu kernel leaves save_mean and
        # save_invstd as they were, while the functional op returns them empty).
        return None
    schema = op._schema
    base = schema.name.split("::")[1]
    if base.endswith("_") and not base.endswith("__"):
        base = base[:-1]
    want = _signature(schema, tuple(desc.out_names))
    n_mutated = len(desc.mutated) + len(desc.out_names)
    n_plain_returns = sum(1 for r in schema.returns if r.alias_info is None)
    for name in (base, base + "_functional", "_" + base + "_functional"):
        packet = getattr(aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            cand = getattr(packet, overload)
            cs = cand._schema
            if any(a.alias_info is not None and a.alias_info.is_write for a in cs.arguments):
                continue
            if _signature(cs) != want:
                continue
            if desc.out_names:
                expected = len(desc.out_names)
            else:
                expected = n_plain_returns + len(desc.mutated)
            # `foo_` returning its (aliased) self: `foo` returns the new self.
            if len(cs.returns) == expected or (not desc.out_names and len(cs.returns) == n_mutated
                                               and n_plain_returns == 0):
                return cand
    return None


_DESCS: Dict[Any, OpDesc] = {}


def describe(op: torch._ops.OpOverload) -> OpDesc:
    """The cached OpDesc of an overload."""
    desc = _DESCS.get(id(op))  # by id: overloads live as long as the process, their __hash__ is Python
    if desc is None:
        desc = _DESCS[id(op)] = OpDesc(op)
    return desc

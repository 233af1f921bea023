"""The capture policy: what the interpreter's boxes mean while a compiled function runs for the first time.

A box's metadata says what a replay needs to know about its value:
- ``None``: a constant (a literal, or computed from constants only);
- an ``E`` (lazy/capture/expr.py): read from state the function did not create (an argument, a global, an attribute),
  or a number computed from such values (symbolic), or a host op's result (a register);
- ``New``: an object the call created (a list it built, a function it defined); its contents are shadowed so that
  values stored in it keep their metadata;
- ``Bound``: a method bound to a box, so that calling it keeps knowing the receiver.
Lazy tensors the call created need no metadata: they are values of the graph the recorder is building.

Operations on tensors go to ``torch_call`` (lazy ops are recorded as usual; ops on host tensors become host ops
replayed before the graph); operations on numbers build expressions; stores into pre-existing objects become
effects; values are guarded where they are used (Note [Guards] in lazy/capture/session.py).
"""
from __future__ import annotations

import types
from typing import Any, Dict, List, Optional


from .. import _C
from ..device.tensor import LazyTensor
from . import expr as X
from .expr import _SYMBOLIC, E, specialized
from .boxes import CONSTANT_TYPES, NUMBERS, SIZES, Bound, BoxIter, New, is_tensor, library_code, python_method
from .guards import tensor_signature
from .interpreter import Box, Frame, Generator, decode
from .plain_policy import BINARY, COMPARE, UNARY, Policy
from .session import CaptureBreak, Effect, Session, plain_store

class CapturePolicy(Policy):
    def __init__(self, session: Session, fullgraph: bool = False) -> None:
        self.s = session
        self.fullgraph = fullgraph
        self.leaves_seen: Dict[int, tuple] = {}  # id(tensor) -> (tensor, box): lazy leaves requiring grad

    # ---- where we are, and breaking ----

    def where(self) -> str:
        frames = self.interp.frames
        return frames[-1].where() if frames else "<entry>"

    def breaks(self, reason: str, transient: bool = False) -> None:
        where = self.user_where()
        self.s.breaks(reason, where, transient)
        if self.fullgraph:
            raise CaptureBreak(f"lazy.compile(fullgraph=True): {reason} (at {where})")

    def user_where(self) -> str:
        """The innermost interpreted frame in user code (outside torch and lazy), else the innermost frame."""
        for frame in reversed(self.interp.frames):
            name = frame.code.code.co_filename
            if not library_code(name):
                return frame.where()
        return self.where()

    # ---- guards ----

    def need(self, b: Box, how: str) -> None:
        """Guard what a use of ``b`` depends on, if ``b`` was read from state (Note [Guards])."""
        e = b.m
        if type(e) is not E:
            return
        v = b.v
        if isinstance(v, _SYMBOLIC) and how != "type":
            # a size of a capture with symbolic sizes: what is decided on it (``int()``, ``bool()``, a branch) is a
            # guard of its ShapeEnv, checked at a replay of other sizes; at the capture's own sizes the tensor's
            # guard fixes it (Note [Dynamic captures])
            return
        if _on_registers(e):
            if how == "tensor":
                return  # a host op's result: its metadata follows from its (guarded) inputs
            self.breaks("decides its control flow on a value a host op computes at each call")
            return
        if how == "tensor":
            self.s.guard("tensor", e, tensor_signature(v))
            self.reached(v, e)
        elif how == "id":
            self.s.guard("id", e, v)
            self.s.remember(v)
        elif how == "type":
            self.s.guard("type", e, type(v))
        elif how == "eq":
            self.s.guard("eq", e, v)
        elif how == "truth":
            self.s.guard("truth", e, bool(v))
        elif how == "none":
            self.s.guard("isnone", e, v is None)
        elif how == "len":
            self.s.guard("len", e, len(v))
        elif how == "keys":
            self.s.guard("keys", e, tuple(v.keys()))
            self.s.remember(tuple(v.keys()))

    def concrete(self, b: Box) -> Any:
        """``b``'s value, guarded to stay what it is: for a number used as a shape, an index, a key."""
        if isinstance(b.v, _SYMBOLIC):  # a size used as a value (a key, a count): its value, a guard of its ShapeEnv
            b.v = specialized(b.v)
        if type(b.m) is E:
            self.need(b, "id" if not isinstance(b.v, NUMBERS + CONSTANT_TYPES + _SYMBOLIC + (tuple,)) else "eq")
        elif type(b.m) is New and b.m.kind in ("list", "tuple"):
            for x in b.m.items:
                self.concrete(x)
        return b.v

    # ---- reading state ----

    def read(self, value: Any, e: E) -> Box:
        if isinstance(value, types.GenericAlias):  # ``tuple[Tensor]`` is a new object at every subscript
            self.s.guard("eq", e, value)
            return Box(value)
        if isinstance(value, CONSTANT_TYPES):
            self.s.guard("eq" if not isinstance(value, types.CodeType) else "id", e, value)
            return Box(value)
        self.reached(value, e)
        return Box(value, e)

    def reached(self, value: Any, e: E) -> None:
        """Note [Objects reached twice]: guard that ``e`` stays the object an earlier path reached."""
        if isinstance(value, _SHARED_IMMUTABLE) or type(e) is not E:
            return
        first = self.s.paths.get(id(value))
        if first is None:
            self.s.paths[id(value)] = (value, e)  # held: an id must not be reused while the capture runs
        elif first[1] != e and not _on_registers(e) and not _on_registers(first[1]):
            self.s.guard("same", e, first[1])

    def held(self, t: LazyTensor) -> None:
        """``t`` existed before the call and reached a recording rule from native code that holds it, not through
        the inputs (DDP's Reducer all-reducing its gradient buckets: Note [Tensors native code holds] in
        lazy/distributed/intercept.py): unless the inputs reach its storage too, a replay reads and writes that
        storage through ``t`` itself."""
        st = t._lz_st
        if id(st) not in self.s.storage_source:
            self.s.storage_source[id(st)] = (st, X.pinned(t))
            self.s.remember(t)

    def new(self, value: Any, meta: New) -> Box:
        self.s.created[id(value)] = meta
        self.s.remember(value)
        return Box(value, meta)

    def box(self, value: Any) -> Box:
        if isinstance(value, Generator):
            return self.new(value, New("generator"))
        if isinstance(value, BaseException):
            return Box(value)
        return self.new(value, New("object"))

    def load_global(self, frame: Frame, name: str) -> Box:
        written = self.s.written.get((id(frame.globals), name))
        if written is not None:
            return written
        if name in frame.globals:
            return self.read(frame.globals[name], X.item(X.pinned(frame.globals), name))
        if name in frame.builtins:
            self.s.guard("absent", X.pinned(frame.globals), name)
            return self.read(frame.builtins[name], X.item(X.pinned(frame.builtins), name))
        raise NameError(f"name {name!r} is not defined")

    def store_global(self, frame: Frame, name: str, value: Box) -> None:
        frame.globals[name] = value.v
        self._effect("setitem", X.pinned(frame.globals), name, value, (id(frame.globals), name),
                     held=(frame.globals, name))

    def delete_global(self, frame: Frame, name: str) -> None:
        del frame.globals[name]
        self._effect("delitem", X.pinned(frame.globals), name, None, (id(frame.globals), name))

    def _effect(self, kind: str, target: E, key: Any, value: Optional[Box], written_key: Any,
                obj: Any = None, held: Any = None) -> None:
        place = written_key if value is not None and plain_store(kind, obj, key) else None
        self.s.effects.append(Effect(kind, target, key, value, place, held))
        if value is not None:
            self.s.written[written_key] = value
        else:
            self.s.written.pop(written_key, None)

    # ---- attributes ----

    def getattr(self, obj: Box, name: str) -> Box:
        v, m = obj.v, obj.m
        written = self.s.written.get((id(v), name))
        if written is not None:
            return written
        if type(m) is New and name in m.attrs:
            return m.attrs[name]
        if is_tensor(v):
            from .method_models import tensor_attribute
            return tensor_attribute(self, obj, name)
        value = getattr(v, name)
        if type(m) is Bound and m.name == "<super>":  # super(cls, obj).name: bound to obj
            owner = m.recv
            if callable(value) and getattr(value, "__self__", None) is owner.v:
                return Box(value, Bound(owner, name))
            return Box(value)  # found on a class after super()'s: as constant as the classes
        if callable(value) and getattr(value, "__self__", None) is v and not isinstance(v, (type, types.ModuleType)):
            if type(m) is E:
                self.need(obj, "type")
                func = getattr(value, "__func__", None)
                if func is not None:
                    self.s.guard("id", X.attr(X.attr(m, name), "__func__"), func)
            return Box(value, Bound(obj, name))
        if type(m) is E:
            self.need(obj, "type")
            return self.read(value, X.attr(m, name))
        if type(m) is New and m.kind == "object":
            return Box(value)  # a class attribute of a local object's class: as constant as the class
        if type(m) is E or (m is not None and type(m) is not New):
            return Box(value)
        return Box(value)

    def setattr(self, obj: Box, name: str, value: Box) -> None:
        v = obj.v
        hook = type(v).__setattr__
        if type(hook) is types.FunctionType:  # a Python __setattr__ (nn.Module's): its stores are tracked inside
            self.call(Box(hook), [obj, self.const(name), value], {})
            return
        self.set_attribute(obj, name, value)

    def set_attribute(self, obj: Box, name: str, value: Box) -> None:
        """``object.__setattr__(obj, name, value)``: on an object the call created, a shadowed store; on any other,
        an effect."""
        v, m = obj.v, obj.m
        object.__setattr__(v, name, value.v) if not is_tensor(v) else setattr(v, name, value.v)
        if type(m) is New:
            m.attrs[name] = value
        elif type(m) is E:
            self.need(obj, "type")
            self._effect("setattr", m, name, value, (id(v), name), v, (v, name))
        elif not (is_tensor(v) and m is None):
            self.breaks(f"stores attribute {name!r} on a {type(v).__name__} it did not reach through its inputs")

    def delattr(self, obj: Box, name: str) -> None:
        v, m = obj.v, obj.m
        delattr(v, name)
        if type(m) is New:
            m.attrs.pop(name, None)
        elif type(m) is E:
            self._effect("delattr", m, name, None, (id(v), name))
        else:
            self.breaks(f"deletes attribute {name!r} of a {type(v).__name__} it did not reach through its inputs")

    # ---- items ----

    def key_of(self, key: Box) -> Any:
        """An item key as the replay will write it: its expression for an object read from state (a tensor keying
        optimizer state), else its (guarded) value."""
        if isinstance(key.v, _SYMBOLIC):
            return self.concrete(key)
        if type(key.m) is E and not isinstance(key.v, NUMBERS + CONSTANT_TYPES + (tuple,)):
            self.need(key, "id")
            return key.m
        return self.concrete(key)

    def written_item(self, obj: Box, key: Box, kexpr: Any) -> Any:
        """The key under which ``Session.written`` holds a store into item ``key`` of ``obj`` (read from state):
        the key's identity where it is itself read from state (a tensor keying optimizer state), else its value,
        a sequence's negative index counted from the end (``v[-1]`` and ``v[len(v) - 1]`` are one place). None
        for a slice (a slice store breaks: it moves other items) or any other unhashable key: nothing is stored
        under it."""
        v = obj.v
        if type(kexpr) is E:
            return (id(v), ("item", id(key.v)))
        if type(kexpr) is slice:  # hashable from Python 3.12, still no one place
            return None
        if type(kexpr) is int and kexpr < 0 and isinstance(v, (list, tuple)):
            self.need(obj, "len")
            kexpr += len(v)
        try:
            hash(kexpr)
        except TypeError:
            return None
        return (id(v), ("item", kexpr))

    def stored_item(self, obj: Box, key: Box, kexpr: Any) -> Optional[Box]:
        """The box the call stored into item ``key`` of ``obj`` (read from state), if it did (``written_item``)."""
        where = self.written_item(obj, key, kexpr)
        return self.s.written.get(where) if where is not None else None

    def getitem(self, obj: Box, key: Box) -> Box:
        v, m = obj.v, obj.m
        if is_tensor(v):
            return self.torch_call(Box(_getitem), [obj, key], {})
        if type(m) is New and (hook := python_method(type(v), "__getitem__")) is not None:
            return self.call(Box(hook), [obj, key], {})  # Note [Dicts of a subclass the call creates]
        if type(m) is New and m.kind in ("list", "tuple"):
            k = self.concrete(key)
            picked = m.items[k]
            if isinstance(k, slice):
                return self.new(v[k], New(m.kind, list(picked)))
            return picked
        if type(m) is New and m.kind == "dict":
            k = self.concrete(key)
            v[k]  # noqa: B018 -- raises KeyError as the real lookup would
            return m.items[k]
        if type(m) is E:
            self.need(obj, "type")
            kexpr = self.key_of(key)
            if isinstance(key.v, slice) and isinstance(v, (list, tuple)):
                self.need(obj, "len")
                items = []
                for i in range(len(v))[key.v]:  # each item as its own read would give it
                    stored = self.stored_item(obj, key, i)
                    items.append(stored if stored is not None else self.read(v[i], X.item(m, i)))
                return self.new(v[key.v], New("list" if isinstance(v, list) else "tuple", items))
            written = self.stored_item(obj, key, kexpr)
            if written is not None:
                return written
            if type(v) is __import__("collections").defaultdict and key.v not in v:
                self.breaks("reads a missing key of a defaultdict (an optimizer's first step creates its state)",
                            transient=True)
            return self.read(v[key.v], X.item(m, kexpr))
        return Box(v[self.concrete(key)])

    def setitem(self, obj: Box, key: Box, value: Box) -> None:
        v, m = obj.v, obj.m
        if is_tensor(v):
            self.torch_call(Box(_setitem), [obj, key, value], {})
            return
        if type(m) is New and (hook := python_method(type(v), "__setitem__")) is not None:
            self.call(Box(hook), [obj, key, value], {})
            return
        if type(m) is New and m.kind in ("list", "dict"):
            k = self.concrete(key)
            v[k] = value.v
            if m.kind == "dict":
                m.items[k] = value
            elif isinstance(k, slice):
                m.items[k] = self.items(value)
            else:
                m.items[k] = value
            return
        if type(m) is E:
            self.need(obj, "type")
            kexpr = self.key_of(key)
            where = self.written_item(obj, key, kexpr)
            v[key.v] = value.v
            if where is None:
                self.breaks(f"stores into a {type(v).__name__} it reached from its inputs under a "
                            f"{type(key.v).__name__} key")
                return
            self._effect("setitem", m, kexpr, value, where, v, (v, key.v))
            return
        self.breaks(f"stores into a {type(v).__name__} it did not reach through its inputs")
        v[key.v] = value.v

    def delitem(self, obj: Box, key: Box) -> None:
        v, m = obj.v, obj.m
        if type(m) is New and (hook := python_method(type(v), "__delitem__")) is not None:
            self.call(Box(hook), [obj, key], {})
            return
        if type(m) is New and m.kind in ("list", "dict"):
            k = self.concrete(key)
            del v[k]
            del m.items[k]
            return
        if type(m) is E:
            kexpr = self.key_of(key)
            where = self.written_item(obj, key, kexpr)
            del v[key.v]
            if where is None or isinstance(v, list):  # a list's deletion moves the items after it
                self.breaks(f"deletes from a {type(v).__name__} it reached from its inputs")
                return
            self._effect("delitem", m, kexpr, None, where)
            return
        self.breaks(f"deletes from a {type(v).__name__} it did not reach through its inputs")
        del v[key.v]

    # ---- operators ----

    def binary(self, op: str, a: Box, b: Box) -> Box:
        if is_tensor(a.v) or is_tensor(b.v):
            return self.torch_call(Box(BINARY[op]), [a, b], {})
        if type(a.v) in SIZES and type(b.v) in SIZES:
            value = BINARY[op](a.v, b.v)
            if type(a.m) is E or type(b.m) is E:
                return Box(value, X.binary(op.rstrip("=") if op.endswith("=") and op not in ("==",) else op,
                                           _operand(a), _operand(b)))
            return Box(value)
        from .builtin_models import sequence_binary
        return sequence_binary(self, op, a, b)

    def unary(self, op: str, a: Box) -> Box:
        if is_tensor(a.v):
            if op == "not":
                return Box(not self.truth(a))
            return self.torch_call(Box(UNARY[op]), [a], {})
        if op == "not":
            return Box(not self.truth(a))
        if type(a.v) in NUMBERS:
            value = UNARY[op](a.v)
            return Box(value, X.unary(op, a.m)) if type(a.m) is E else Box(value)
        return Box(UNARY[op](self.concrete(a)))

    def compare(self, op: str, a: Box, b: Box) -> Box:
        if op in ("is", "is not"):
            result = COMPARE[op](a.v, b.v)
            for x, other in ((a, b), (b, a)):
                if other.v is None and other.m is None:
                    self.need(x, "none")
                else:
                    self.need(x, "id")
            return Box(result)
        if (is_tensor(a.v) or is_tensor(b.v)) and op not in ("in", "not in"):
            return self.torch_call(Box(COMPARE[op]), [a, b], {})
        if op in ("in", "not in") and type(b.m) is New and b.m.kind in ("list", "tuple", "set", "dict"):
            self.concrete(a)
            for x in (b.m.items if b.m.kind != "dict" else [Box(k) for k in b.m.items]):
                self.concrete(x)
            return Box(COMPARE[op](a.v, b.v))
        result = COMPARE[op](a.v, b.v)
        if type(a.m) is E or type(b.m) is E:
            if type(a.m) is New or type(b.m) is New:
                self.concrete(a)
                self.concrete(b)
                return Box(result)
            if op in ("in", "not in") and type(b.m) is E and type(a.m) is not E:
                a_operand = self.key_of(a)
                return Box(result, E("cmp", op, a_operand, b.m))
            return Box(result, E("cmp", op, _operand(a), _operand(b)))
        return Box(result)

    def truth(self, a: Box) -> bool:
        v, m = a.v, a.m
        if type(m) is New:
            if m.kind in ("list", "tuple", "dict"):
                return bool(m.items)
            return bool(v)
        result = bool(v)
        if type(m) is E:
            self.need(a, "truth")
        return result

    # ---- containers ----

    def build(self, kind: str, items: List[Box]) -> Box:
        if kind in ("tuple", "list"):
            return self.new(tuple(x.v for x in items) if kind == "tuple" else [x.v for x in items],
                            New(kind, list(items)))
        if kind == "set":
            return self.new({self.concrete(x) for x in items}, New("set", list(items)))
        if kind == "slice":
            # a symbolic bound stays symbolic (``pos[:t]`` slices a tensor); a list sliced with it specializes it
            return Box(slice(*[x.v if isinstance(x.v, _SYMBOLIC) else self.concrete(x) for x in items]))
        return Box("".join(self.concrete(x) for x in items))

    def build_map(self, keys: List[Box], values: List[Box]) -> Box:
        shadow = {}
        real = {}
        for k, v in zip(keys, values):
            key = self.concrete(k)
            shadow[key] = v
            real[key] = v.v
        return self.new(real, New("dict", shadow))

    def items(self, b: Box) -> List[Box]:
        """The elements of a sequence as boxes (shadowed, read from state with provenance, or iterated)."""
        m = b.m
        if type(m) is New and m.kind in ("list", "tuple"):
            return list(m.items)
        if type(m) is E and isinstance(b.v, (list, tuple)):
            self.need(b, "len")
            self.need(b, "type")
            return [self.read(x, X.item(m, i)) for i, x in enumerate(b.v)]
        it = self.iterate(b)
        out = []
        while True:
            nxt = self.next(it)
            if nxt is None:
                return out
            out.append(nxt)

    def container_op(self, op: str, target: Box, *args: Box) -> None:
        m = target.m
        if type(m) is not New:
            self.breaks(f"updates a container it did not create ({op})")
            return super().container_op(op, target, *args)
        if op == "list_append":
            target.v.append(args[0].v)
            m.items.append(args[0])
        elif op == "list_extend":
            new = self.items(args[0])
            target.v.extend(x.v for x in new)
            m.items.extend(new)
        elif op in ("set_add", "set_update"):
            new = [args[0]] if op == "set_add" else self.items(args[0])
            for x in new:
                target.v.add(self.concrete(x))
            m.items.extend(new)
        elif op == "map_add":
            key = self.concrete(args[0])
            target.v[key] = args[1].v
            m.items[key] = args[1]
        else:  # dict_update, dict_merge
            from .lookaside import mapping_items
            for key, value in mapping_items(self, args[0]):
                if op == "dict_merge" and key in target.v:
                    raise TypeError(f"got multiple values for keyword argument '{key}'")
                target.v[key] = value.v
                m.items[key] = value

    def list_to_tuple(self, lst: Box) -> Box:
        return self.new(tuple(lst.v), New("tuple", self.items(lst)))

    def unpack(self, seq: Box, count: int, star: Optional[int] = None) -> List[Box]:
        items = self.items(seq)
        if star is None:
            if len(items) != count:
                raise ValueError(f"{'too many' if len(items) > count else 'not enough'} values to unpack "
                                 f"(expected {count}, got {len(items)})")
            return items
        after = count - star - 1
        if len(items) < count - 1:
            raise ValueError(f"not enough values to unpack (expected at least {count - 1}, got {len(items)})")
        rest = items[star:len(items) - after]
        return items[:star] + [self.new([x.v for x in rest], New("list", rest))] + items[len(items) - after:]

    def iterate(self, obj: Box) -> Box:
        from .lookaside import iterate
        return iterate(self, obj)

    def next(self, it: Box) -> Optional[Box]:
        m = it.m
        if type(m) is BoxIter:
            return next(m.it, None)
        return super().next(it)

    def format(self, value: Box, conversion: Optional[str], spec: Optional[Box]) -> Box:
        self.concrete(value)
        if spec is not None:
            self.concrete(spec)
        return super().format(value, conversion, spec)

    # ---- cells and functions ----

    def make_cell(self, contents: Optional[Box]) -> Box:
        cell = types.CellType() if contents is None else types.CellType(contents.v)
        return self.new(cell, New("cell", contents))

    def cell_get(self, cell: Box, name: str) -> Box:
        m = cell.m
        if type(m) is New:
            if m.items is None:
                raise NameError(f"cannot access free variable {name!r} where it is not associated with a value in "
                                "enclosing scope")
            return m.items
        try:
            value = cell.v.cell_contents
        except ValueError:
            raise NameError(f"cannot access free variable {name!r} where it is not associated with a value in "
                            "enclosing scope") from None
        return self.read(value, X.attr(cell.m, "cell_contents")) if type(cell.m) is E else Box(value)

    def cell_set(self, cell: Box, value: Optional[Box]) -> None:
        m = cell.m
        if value is None:
            del cell.v.cell_contents
        else:
            cell.v.cell_contents = value.v
        if type(m) is New:
            m.items = value
        elif type(m) is E:
            self.s.effects.append(Effect("cell_set", m, None, value, held=(cell.v, None)))
        else:
            self.breaks("writes a closure variable of a function it did not reach through its inputs")

    def closure_cell(self, func: types.FunctionType, index: int) -> Box:
        cell = func.__closure__[index]
        meta = self.s.created.get(id(cell))
        if meta is not None:
            return Box(cell, meta)
        return Box(cell, X.pinned(cell))

    def make_function(self, frame: Frame, code: Box, defaults: Optional[Box], kwdefaults: Optional[Box],
                      annotations: Optional[Box], closure: Optional[Box]) -> Box:
        fn = super().make_function(frame, code, defaults, kwdefaults, annotations, closure).v
        meta = New("function")
        if defaults is not None:
            meta.attrs["__defaults__"] = defaults
        return self.new(fn, meta)

    def exception(self, exc: BaseException) -> Box:
        return Box(exc)

    # ---- calls ----

    def call(self, fn: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        from .lookaside import call
        return call(self, fn, args, kwargs)

    def call_ex(self, fn: Box, args: Box, kwargs: Optional[Box]) -> Box:
        from .lookaside import mapping_items
        pos = self.items(args)
        kw = {k: v for k, v in mapping_items(self, kwargs)} if kwargs is not None else {}
        return self.call(fn, pos, kw)

    def run_python(self, func: types.FunctionType, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        """Interpret ``func``, with the function's defaults as constants (guarded by the function's identity)."""
        return self.interp.run_function(func, args, kwargs)

    def import_name(self, frame: Frame, name: str, fromlist: Box, level: Box) -> Box:
        module = __import__(name, frame.globals, None, fromlist.v, level.v)
        return Box(module, X.pinned(module))

    # ---- tensors ----

    def torch_call(self, fn: Box, args: List[Box], kwargs: Dict[str, Box], recv: Optional[Box] = None) -> Box:
        from .tensors import torch_call
        return torch_call(self, fn, args, kwargs, recv)


# Note [Objects reached twice]
# The capture knows an object by its identity: a store through one expression (``opt.param_groups[0]["params"][0]
# .grad = None`` in zero_grad) is what a later read through another (``model.tok.weight.grad``) sees, and a
# storage the graph reads and updates is read and written through the first expression that reached it. A replay
# evaluates each expression again, so it is sound only while expressions that reached one object still do: a
# model whose parameter was replaced (``model.w = nn.Parameter(...)``) while the optimizer holds the old one would
# have the replay update the new parameter with the old one's optimizer state. So the second expression that reaches
# an object is guarded to be the first's object (``same``: an identity test of two loads, as Dynamo's guards on
# duplicate inputs do); a miss recompiles. Objects that cannot hold state the capture tracks (numbers, strings,
# tuples, functions, classes, modules) are not followed: small ints and interned strings share one id anyway.
_SHARED_IMMUTABLE = NUMBERS + CONSTANT_TYPES + (tuple, frozenset, type, types.ModuleType, types.FunctionType,
                                                types.BuiltinFunctionType, types.MethodType)


def _on_registers(e: E) -> bool:
    return any(r.op == "reg" for r in X.roots(e))


def _operand(b: Box) -> Any:
    return b.m if type(b.m) is E else b.v


def _getitem(a: Any, k: Any) -> Any:
    return a[k]


def _setitem(a: Any, k: Any, v: Any) -> None:
    a[k] = v


__all__ = ["CapturePolicy", "decode", "_C"]

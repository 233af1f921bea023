"""A capture entry: its guards and its replay, rendered as Python functions over the call's arguments.

``Entry(session, plan, program)`` renders two functions from a finished capture (lazy/capture/finalize.py):
- ``check(A)``: every guard of the capture (Note [Guards] in lazy/capture/session.py), one boolean expression;
- ``run(A)``: the host ops and the numbers the graph takes as runtime scalars, the graph inputs read from the
  current state, the compiled program, then the writes: new values into the storages the call changed, new tensors
  for those it created, the effects on Python objects in order, and the return value.
Both are generated source (``lazy.explain(fn)`` shows it), so a replay runs the few attribute reads, arithmetic and
stores the function's Python did, without interpreting or recording anything.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import _C
from ..device.backing import to_backing
from ..sync import launch
from . import expr as X
from .expr import _SYMBOLIC, E, Renderer, compile_function
from .finalize import Plan
from .guards import compile_guards, compile_loads, tensor_signature
from .python_guards import _GUARD_HELPERS, STATE_CALLS, _describe_now, _guard, _python_check
from .interpreter import Box
from .boxes import New, is_lazy
from .session import Session


class Pending(Exception):
    """An input storage holds pending IR (the caller recorded ops on it before the call): sync, then replay."""


class Miss(Exception):
    """A check the guards cannot express failed at replay (inputs that shared no storage now share one)."""


def _counter_op(op: Any, added: Dict[int, Any]) -> Optional[tuple]:
    """(tensor operand, whether it adds, number) of a host op ``_C.host_steps`` may run (Note [Host step counters
    in C] in csrc/replay_io.cpp): ``t += n`` or ``t.item()``, where ``t`` reads no register but the result of an
    earlier ``+=`` (``added``: its index -> its tensor operand); else None."""
    e = op.fn
    if type(e) is not E:
        return None
    if e.op == "call" and e.args[0] is operator.iadd and not e.args[2] and len(e.args[1]) == 2 \
            and type(e.args[1][1]) in (int, float):
        t, add, value = e.args[1][0], True, e.args[1][1]
    elif e.op == "meth" and e.args[1] == "item" and not e.args[2] and not e.args[3]:
        t, add, value = e.args[0], False, None
    else:
        return None
    if type(t) is E and t.op == "reg":
        t = added.get(t.args[0])
    return None if t is None or _reads_register(t) else (t, add, value)


def _reads_register(e: Any) -> bool:
    if type(e) is E:
        return e.op == "reg" or any(_reads_register(a) for a in e.args)
    return type(e) is tuple and any(_reads_register(a) for a in e)


def _host_runs(ops: List[Any]) -> List[tuple]:
    """The host ops as (ops, counters): maximal runs of consecutive step-counter ops with what ``_counter_op``
    made of each, and each other op alone (counters None)."""
    runs: List[tuple] = []
    added: Dict[int, Any] = {}
    for op in ops:
        counter = _counter_op(op, added)
        if counter is None:
            runs.append(([op], None))
            continue
        if counter[1]:
            added[op.index] = counter[0]
        if runs and runs[-1][1] is not None:
            runs[-1][0].append(op)
            runs[-1][1].append(counter)
        else:
            runs.append(([op], [counter]))
    return runs


def _storage_inputs(tensors: tuple) -> list:
    """The data of each storage a replay reads (Note [Replay bookkeeping in C] in csrc/replay_io.cpp); Pending if
    one holds IR, Miss if two share a storage (distinct at capture: the graph does not hold)."""
    data = _C.replay_inputs(tensors, Pending, Miss)
    if launch.busy():  # an asynchronous execution in flight (or failed): wait for what this replay reads
        for d in data:
            launch.ready(d)
    return data


def _write_bound(program: Any, tensors: tuple, outs: list, indices: tuple, templates: Any) -> None:
    """``replay_writes`` for a program that keeps what it binds (a CUDA graph's static memory): it learns of the
    new leaves (none where every write was in place: Note [Rebinding written in place] in csrc/replay_io.cpp)."""
    if _C.replay_writes(tensors, outs, indices, templates):
        program.bound(tensors, outs, indices)


_CONSUMED = ("Trying to backward through the graph a second time (or directly access saved tensors after they have "
             "already been freed): the function compiled with lazy.compile already ran backward through this "
             "tensor's graph.")


def _consumed(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a new output of the replay) with the history of an output whose graph a backward inside the function
    already used: any backward through it raises, as it would in eager (autograd's Error node, set in C: the same
    through a Python autograd.Function cost a GPT step's replay ~0.07 ms on the GPU machines' hosts)."""
    return _C.error_history(t, _CONSUMED)


class Entry:
    """One captured specialization of a function: guards, program and replay."""

    def __init__(self, s: Session, plan: Plan, program: Any, state: tuple, breaks: Callable[[str], None]) -> None:
        self.program = program
        self._each_term: Optional[Callable[[tuple], list]] = None  # failures(): compiled at the first miss
        self.state = state
        self.hits = 0
        self.shapes: Any = None  # a capture with symbolic sizes: its recording (lazy/capture/dynamic.py)
        # What a replay writes, for LAZY_CAPTURE_VERIFY (lazy/capture/verify.py) and lazy.explain
        self.effects = list(s.effects)
        self.storage_exprs = [e for kind, e in plan.inputs if kind == "storage"] + [e for _, e in plan.mutated]
        self.host_tensor_exprs = _host_receivers(s)
        self.generators = [op.fn.args[1][0].args[0] for op in s.host_ops
                           if op.fn.op == "call" and op.fn.args[1] and type(op.fn.args[1][0]) is E
                           and op.fn.args[1][0].op == "obj" and isinstance(op.fn.args[1][0].args[0], torch.Generator)]
        self.num_guards = len(s.guards) + 1
        self.num_nodes = len(plan.lin.order) if plan.lin is not None else 0
        self.python_check = self._render_check(s, plan)
        guards = [(kind, e, expected) for (kind, e), expected in s.guards.items()]
        # Note [Guard programs] in csrc/capture_guards.cpp
        self.check, self.guard_program, self.residual_guards = guard_check(state, guards)
        self.run, _ = self._render_run(s, plan, breaks)
        self.run_source = self.run.__lazy_source__

    # ---- guards ----

    def _render_check(self, s: Session, plan: Plan) -> Callable[[tuple], bool]:
        r = Renderer()
        fn = _python_check(r, list(s.guards.items()), self.state)
        terms = [f"_global_state() == {r.const(self.state)}"]
        self.check_source = fn.__lazy_source__
        self.guards = [("global state", "_global_state()", self.state)] + [
            (kind, repr(e), expected) for (kind, e), expected in s.guards.items()]
        plain = Renderer()  # one guard at a time, for reports: no temporaries
        plain.consts = r.consts
        plain._const_at = r._const_at
        self._terms = [terms[0]] + [_guard(plain, kind, e, expected) for (kind, e), expected in s.guards.items()]
        # each guarded value as source over the same constants (repr(e) numbers its constants on its own)
        self._values = ["_global_state()"] + [plain.expr(e) for (kind, e) in s.guards]
        self._consts = r.consts
        return fn

    def failures(self, A: tuple) -> List[str]:
        """The guards ``A`` fails, each as "kind expression: expected ..., now ..." (for recompile reasons)."""
        if self._each_term is None:
            # every guard's answer (or the exception it raised) in one function, compiled at the first miss: a
            # function per guard was ~1,700 compiles at each miss of a GPT step
            lines = ["out = []"]
            for term in self._terms:
                lines += ["try:", f"    out.append({term})", "except Exception as e:", "    out.append(e)"]
            self._each_term = compile_function("each_term", "A", lines + ["return out"], self._consts)
            self._each_term.__globals__.update(_GUARD_HELPERS)
        out = []
        for (kind, text, expected), ok, value in zip(self.guards, self._each_term(A), self._values):
            if ok is not True:
                now = _describe_now(value, A, self._consts) if not isinstance(ok, Exception) else f"raised {ok!r}"
                out.append(f"{kind} {text}: expected {expected!r}, now {now}")
        return out

    # ---- replay ----

    def render_sized_run(self, s: Session, plan: Plan, breaks: Callable[[str], None]) -> Tuple[Callable, list]:
        """``run`` as ``run(A, V)`` for a capture with symbolic sizes: what depends on the sizes (the program, the
        constant inputs and scalars, the new tensors' layouts, the symbolic numbers it stores or returns: the list
        returned with it) read from ``V``, a ``Sized`` of lazy/capture/dynamic.py, not from the recording."""
        return self._render_run(s, plan, breaks, sized=True)

    def _render_run(self, s: Session, plan: Plan, breaks: Callable[[str], None],
                    sized: bool = False) -> Tuple[Callable, Optional[list]]:
        r = Renderer()
        r.sized = "a replay at other sizes" if sized else ""
        r.share(_run_expressions(s, plan))
        body: List[str] = []
        if s.host_ops:
            body.append(f"R = [None] * {len(s.host_ops)}")
        for run, counters in _host_runs(s.host_ops):
            lines = [f"R[{op.index}] = {r.expr(op.fn)}" for op in run]
            if counters is None or len(run) < 2:
                body.extend(lines)
                continue
            # Note [Host step counters in C] (csrc/replay_io.cpp): the run in C, or as Python where it declines
            tensors = "".join(f"{r.expr(t)}, " for t, _, _ in counters)
            adds = "".join(f"{add}, " for _, add, _ in counters)
            values = "".join(f"{r.const(v)}, " for _, _, v in counters)
            body.append(f"H = _host_steps(({tensors}), ({adds}), ({values}))")
            body.append("if H is None:")
            body.extend("    " + line for line in lines)
            body.append("else:")
            body.append(f"    R[{run[0].index}:{run[-1].index + 1}] = H")
        lin = plan.lin
        storage_inputs = [e for kind, e in plan.inputs if kind == "storage"] if lin is not None else []
        if storage_inputs:
            # Read (and checked distinct: at capture they were, or the graph differs) before the host ops run, so a
            # replay that cannot go on has changed nothing.
            body.insert(0, f"D = _storage_inputs(({''.join(r.expr(e) + ', ' for e in storage_inputs)}))")
        if lin is not None:
            leaf_nodes = [n for n in lin.order if n.is_data]
            inputs = []
            consts = 0
            for (kind, e), node in zip(plan.inputs, leaf_nodes):
                if kind == "storage":
                    inputs.append(f"D[{sum(1 for i in inputs if i.startswith('D['))}]")
                elif kind == "host" and e.op == "attr" and e.args[1] == "data":
                    inputs.append(r.expr(e))
                elif kind == "host":
                    inputs.append(f"_snapshot({r.expr(e)}, {r.const(node.dtype)})")
                elif sized:
                    inputs.append(f"V.consts[{consts}]")
                    consts += 1
                else:
                    inputs.append(r.const(e))
            body.append(f"I = [{', '.join(inputs)}]")
            scalars = []
            for k, (kind, v) in enumerate(plan.scalars):
                scalars.append(f"R[{v}]" if kind == "reg" else r.expr(v) if kind == "expr" else
                               f"V.scalars[{k}]" if sized else r.const(v))
            # a tuple: of literals only (a function's own constants), it is one constant object, which a run from
            # Python packs once (runtime/cpp.py); a run in C packs it in the call that takes its values
            body.append(f"S = ({''.join(s + ', ' for s in scalars)})")
            body.append(f"O = {'V.program' if sized else r.const(self.program)}.run(I, S)")
            if plan.mutated:
                targets = "(" + "".join(f"{r.expr(e)}, " for _, e in plan.mutated) + ")"
                indices = r.const(tuple(i for i, _ in plan.mutated))
                # Note [Data leaves from templates] (csrc/leaf_templates.cpp): one per storage written
                templates = r.const(_C.leaf_templates(len(plan.mutated)))
                # a CUDA-graph program keeps what it bound to its static memory (Note [CUDA-graph replay])
                writes = f"{targets}, O, {indices}, {templates}"
                body.append(f"_write_bound({r.const(self.program)}, {writes})"
                            if hasattr(self.program, "bound") and not sized else f"_write_all({writes})")
        made: Dict[int, str] = {}
        created = list((plan.created or {}).items())
        for tid, (i, desc, numel) in created:
            made[tid] = f"T{i}"
        dead = _dead_stores(s)
        self.dead_stores = len(dead)
        reused = _reused_grads(s, plan, dead)  # created tensor -> the effect storing it to an old gradient's place
        self.reusable_grads = len(reused)
        if created:  # in one C call
            names = "".join(f"T{i}, " for _, (i, _, _) in created)
            descs = "V.descs" if sized else r.const(tuple(desc for _, (_, desc, _) in created))
            indices = r.const(tuple(i for _, (i, _, _) in created))
            numels = "V.numels" if sized else r.const(tuple(numel for _, (_, _, numel) in created))
            owners = "None"
            if reused:  # Note [Reused gradient wrappers]: each parameter whose old gradient may take the new value
                for tid, k in reused.items():
                    body.append(f"t{k} = {r.expr(s.effects[k].target)}")
                owners = "(" + "".join(f"t{reused[tid]}, " if tid in reused else "None, " for tid, _ in created) + ")"
            templates = r.const(_C.leaf_templates(len(created)))  # Note [Data leaves from templates]
            body.append(f"({names}) = _new_tensors({descs}, O, {indices}, {numels}, {owners}, {templates})")
        # Every value is computed before the first store: the expressions read the state as the call found it
        # (reads after the function's own stores were resolved at capture), which the stores change.
        renderer = _Values(r, made, plan, breaks, [] if sized else None)
        stores = []
        assigned = set(reused.values())
        for k, eff in enumerate(s.effects):
            if k in dead:
                continue
            target, value, store = renderer.effect(eff)
            if k not in assigned:
                body.append(f"t{k} = {target}")
            if value is not None:
                body.append(f"v{k} = {value}")
            # a gradient offered for reuse is, where it was reused, already the parameter's: _C.store_grads skips it
            stores.append((k,) if k in assigned else store.format(t=f"t{k}", v=f"v{k}"))
        body.append(f"result = {renderer.value(plan.result)}")
        body.extend(_batched_grad_stores(stores))
        body.append("return result")
        preamble, loads = _loads_in_c(r)
        fn = compile_function("replay", "A, V" if sized else "A", preamble + body, r.consts)
        fn.__globals__.update(_host_steps=_C.host_steps, _storage_inputs=_storage_inputs, _snapshot=to_backing,
                              _write_all=_C.replay_writes, _write_bound=_write_bound,
                              _new_tensors=_C.new_tensors, _store_grads=_C.store_grads, _consumed=_consumed,
                              _loads=loads)
        return fn, renderer.numbers


def guard_check(state: tuple, guards: List[tuple]) -> Tuple[Callable[[tuple], bool], Any, list]:
    """(check, guard program, residual guards) of ``guards`` ((kind, expression, expected)) and the global state
    ``state``: the program, then the Python check of the guards it cannot express (if any)."""
    program, residual = compile_guards(state, guards, STATE_CALLS, tensor_signature)
    if not residual:
        return program, program, residual
    rest = _python_check(Renderer(), [((kind, e), expected) for kind, e, expected in residual], None)
    return (lambda A: program(A) and rest(A)), program, residual


def _batched_grad_stores(stores: list) -> List[str]:
    """The store lines, each run of consecutive stores of offered gradients (``(k,)``: ``t{k}.grad = v{k}`` through
    _C.store_grad) as one _C.store_grads call over the run, in the same order."""
    lines: List[str] = []
    run: List[int] = []
    for store in stores + [None]:
        if type(store) is tuple:
            run.append(store[0])
            continue
        if run:
            owners = "".join(f"t{k}, " for k in run)
            values = "".join(f"v{k}, " for k in run)
            lines.append(f"_store_grads(({owners}), ({values}))")
            run = []
        if store is not None:
            lines.append(store)
    return lines


def _loads_in_c(r: Renderer) -> tuple:
    """Note [Replay loads in C]
    A replay first reads the state it works on: a GPT step's 440 shared temporaries (modules, parameters, the
    optimizer's state dicts), each a Python line, and a module's submodules and parameters through
    ``Module.__getattr__``, a Python function (~0.5 us a call): a fifth of the replay's host time on a GPU. The
    temporaries that are chains of loads run instead as one program of the guard instructions (csrc/
    capture_guards.cpp and guard_reads.cpp, the lookup a guard makes, nn.Module's included), which returns their values as a tuple;
    the others (calls) stay Python lines after it. A load program that cannot read a value raises as the Python
    line would (the guards just read the same state)."""
    names = dict(r.temps)
    exprs = list(names)
    program, which = compile_loads(exprs)
    if program is None:
        return r.preamble, None
    moved = [names[exprs[k]] for k in which]
    gone = set(moved)
    rest = [line for line in r.preamble if line.split(" = ", 1)[0] not in gone]
    return [f"({', '.join(moved)},) = _loads(A)"] + rest, program


def _dead_stores(s: Session) -> set:
    """Note [Dead stores]
    A replay computes every stored value first, then stores them in order, so a store that a later store to the
    same place overwrites is never seen: zero_grad's ``p.grad = None`` before backward's ``p.grad = g``, 76 of a
    6-layer GPT step's 152 stores. Such a store is dropped when storing has no effect but binding the value
    (``Effect.place``: a plain attribute, a tensor's ``.grad``, a dict item at a constant key) and both targets are
    the same object at every replay: the same object at capture, which every expression that reached it is guarded
    to stay (Note [Objects reached twice] in lazy/capture/policy.py). An effect in between that does more than bind
    (a deletion, a property's setter, a list method) keeps every store before it: the setter may read the place
    (after ``opt.zero_grad()``, ``p.grad`` is None to it, not the gradient of the step before), and ``d[k] = 1;
    del d[k]; d[k] = 2`` needs its first store for the deletion to find the key."""
    dead = set()
    later = set()
    for k in range(len(s.effects) - 1, -1, -1):
        eff = s.effects[k]
        place = eff.place
        if place is None:
            later.clear()
            continue
        first = s.paths.get(place[0])
        if first is None or not (first[1] == eff.target or s.guards.get(("same", eff.target)) == first[1]):
            continue  # an object no guard ties to this expression
        if place in later:
            dead.add(k)
        later.add(place)
    return dead


def _reused_grads(s: Session, plan: Plan, dead: set) -> Dict[int, int]:
    """Note [Reused gradient wrappers]
    A replay's new gradients may take the wrappers of the gradients they replace: csrc/replay_io.cpp's Note of the
    same name, whose checks at each replay make sure nothing but the parameter holds the old wrapper then. What the
    replay itself does after ``_new_tensors`` is known here, and must not reach the old wrapper either: by then it
    holds the new values, while the stores that replace it come last. So a created tensor is offered for reuse (the
    parameter it is stored to read before ``_new_tensors``, its ``t`` line moved there) only where:
    - it does not require grad, and is stored once, as a ``.grad`` (a live store: Note [Dead stores]), and nowhere
      else, returned neither. (A tensor also stored or returned elsewhere would be held there at the next replay, and
      not reused then; a wrapper returned at this replay could even be reused soundly. Conservative.)
    - every store of the replay only binds its value (``Effect.place``): a property's setter, run among the stores,
      may read the old gradient, which eager's setter saw with its old values (it ran before ``backward``);
    - no expression the replay evaluates after ``_new_tensors`` (store targets and keys, stored and returned values)
      calls anything or reads a ``.grad``: ``old = p.grad; ...; return old`` returns the old gradient, read after
      ``_new_tensors``. Whatever reaches it otherwise (a temporary computed earlier, a container, a constant) holds a
      reference, which the check at replay sees.
    Returns {id(created tensor): index of the effect storing it}."""
    created = plan.created or {}
    live = [(k, eff) for k, eff in enumerate(s.effects) if k not in dead]
    if not created or any(eff.place is None for _, eff in live):
        return {}
    uses: Dict[int, int] = {}
    later: list = []

    def walk(b: Any) -> None:
        if type(b) is tuple:
            for x in b:
                walk(x)
        elif not isinstance(b, Box):
            later.append(b)
        elif type(b.m) is E:
            later.append(b.m)
        elif is_lazy(b.v):
            uses[id(b.v)] = uses.get(id(b.v), 0) + 1
        elif type(b.m) is New and b.m.kind in ("list", "tuple"):
            walk(tuple(b.m.items))
        elif type(b.m) is New and b.m.kind == "dict":
            walk(tuple(b.m.items.values()))
    walk(plan.result)
    for _, eff in live:
        later.append(eff.target)
        later.append(eff.key)
        if eff.value is not None:
            walk(eff.value)
    if any(_may_read_grad(e) for e in later):
        return {}
    out: Dict[int, int] = {}
    for k, eff in live:
        v = eff.value.v if isinstance(eff.value, Box) else None
        if eff.kind == "setattr" and eff.key == "grad" and is_lazy(v) and type(eff.value.m) is not E and \
                id(v) in created and uses.get(id(v)) == 1 and not v.requires_grad:
            out[id(v)] = k
    return out


def _may_read_grad(e: Any) -> bool:
    """Whether evaluating ``e`` may call something or read a tensor's gradient (``.grad``, ``._grad``)."""
    if type(e) is tuple:
        return any(_may_read_grad(x) for x in e)
    if type(e) is not E:
        return False
    if e.op in ("call", "meth") or e.op == "attr" and e.args[1] in ("grad", "_grad"):
        return True
    return any(_may_read_grad(x) for x in e.args)


def _probe_hook_fields() -> bool:
    """Lets csrc/alias.cpp read a tensor's hook fields (Note [Reused gradient wrappers] in csrc/replay_io.cpp)."""
    t = torch.empty(0)
    t._backward_hooks = {}
    t._post_accumulate_grad_hooks = {}
    return _C.probe_hook_fields(t)


_probe_hook_fields()


def _host_receivers(s: Session) -> list:
    """Expressions of the state's objects the host ops act on (an optimizer's step tensors): what they may update."""
    out = []
    for op in s.host_ops:
        e = op.fn
        operands = [e.args[0]] + list(e.args[2]) if e.op == "meth" else list(e.args[1])
        for x in operands:
            if type(x) is E and x.op != "reg" and not any(r.op == "reg" for r in X.roots(x)) and x not in out:
                out.append(x)
    return out


def _run_expressions(s: Session, plan: Plan) -> list:
    """Every expression a replay evaluates (for common-subexpression sharing)."""
    exprs: list = [op.fn for op in s.host_ops]
    exprs += [e for kind, e in plan.inputs if kind in ("storage", "host")]
    exprs += [v for kind, v in plan.scalars if kind == "expr"]
    exprs += [e for _, e in plan.mutated]
    for eff in s.effects:
        exprs.append(eff.target)
        if type(eff.key) is E:
            exprs.append(eff.key)
        values = eff.value if isinstance(eff.value, tuple) else (eff.value,)
        exprs += [v.m for v in values if isinstance(v, Box) and type(v.m) is E]
    return exprs


class _Values:
    """Renders stored and returned values: expressions, rebuilt containers, tensors the graph made."""

    def __init__(self, r: Renderer, made: Dict[int, str], plan: Plan, breaks: Callable[[str], None],
                 numbers: Optional[list] = None) -> None:
        self.r, self.made, self.plan, self.breaks = r, made, plan, breaks
        self.numbers = numbers  # a replay at other sizes: the symbolic numbers it stores or returns (V.numbers)

    def value(self, b: Box) -> str:
        v, m = b.v, b.m
        if type(m) is E:
            return self.r.expr(m)
        if self.numbers is not None and isinstance(v, _SYMBOLIC):
            self.numbers.append(v)  # a number of the sizes (``x.shape[0]`` stored): its value at the replay's
            return f"V.numbers[{len(self.numbers) - 1}]"
        if is_lazy(v):
            name = self.made.get(id(v))
            if name is None:
                self.breaks("returns or stores a tensor capture cannot rebuild")
                return "None"
            if v.requires_grad:
                if id(v) in self.plan.backward_consumed:
                    return f"_consumed({name})"
                self.breaks("returns or stores a tensor with autograd history: run backward inside the function, "
                            "or return .detach()")
            return name
        if type(m) is New:
            if m.kind == "tuple":
                inner = ", ".join(self.value(x) for x in m.items)
                built = f"({inner},)" if len(m.items) == 1 else f"({inner})"
                if type(v) is tuple:
                    return built
                # a namedtuple takes its fields, other tuple types (torch.Size) one iterable
                return f"{self.r.const(type(v))}{built}" if hasattr(type(v), "_fields") else \
                    f"{self.r.const(type(v))}({built})"
            if m.kind == "list":
                return f"[{', '.join(self.value(x) for x in m.items)}]"
            if m.kind == "dict":
                return "{" + ", ".join(f"{self.r.const(k)}: {self.value(x)}" for k, x in m.items.items()) + "}"
            self.breaks(f"returns or stores a {type(v).__name__} it created, which a replay cannot rebuild")
            return "None"
        if isinstance(v, torch.Tensor):
            self.breaks("returns or stores a host tensor capture cannot rebuild")
        return self.r.const(v)

    def effect(self, eff: Any) -> tuple:
        """(target expression, value expression or None, the store as a template over {t} and {v})."""
        t = self.r.expr(eff.target)
        value = self.value(eff.value) if isinstance(eff.value, Box) else None
        if eff.kind == "setattr":
            return t, value, f"object.__setattr__({{t}}, {eff.key!r}, {{v}})"
        if eff.kind == "delattr":
            return t, None, f"object.__delattr__({{t}}, {eff.key!r})"
        if eff.kind == "setitem":
            return t, value, f"{{t}}[{self.r.expr(eff.key)}] = {{v}}"
        if eff.kind == "delitem":
            return t, None, f"del {{t}}[{self.r.expr(eff.key)}]"
        if eff.kind == "cell_set":
            return (t, value, "{t}.cell_contents = {v}") if value is not None else (t, None, "del {t}.cell_contents")
        if eff.kind == "list_method":
            args = "(" + "".join(f"{self.value(a)}, " for a in eff.value) + ")"
            return t, args, f"{{t}}.{eff.key}(*{{v}})"
        raise ValueError(f"lazy capture internal error: effect {eff.kind}")


_ = (X, Optional)

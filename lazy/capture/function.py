"""``lazy.compile``: a function captured once, then replayed under guards.

A ``CompiledFunction`` keeps the entries (lazy/capture/replay.py) captured for its function. A call binds its
arguments, checks the entries' guards and replays the first that holds; on a miss it captures (runs the function
under the capture interpreter, which is the call itself) and keeps a new entry, up to ``max_recompiles``; a function
whose capture breaks (a sync inside, I/O, ...) runs plainly from then on, and ``lazy.explain(fn)`` says why.

Note [Compiled functions are themselves]
``lazy.compile(fn)`` of a plain Python function registers ``fn`` with the frame hook (csrc/capture_hook.cpp, Note
[The frame hook]) and returns ``fn`` itself: a call of ``fn`` from anywhere (a global name, a method of a class
whose body applied the decorator, a reference kept before compiling) reaches the hook, which binds the arguments from
the frame and calls ``CompiledFunction.handle``; no Python wrapper runs. The state (entries, events) is kept per
function object, never per code object: closures made by one ``def`` are separate functions with separate captures.
``state_of(fn)`` finds it through the hook's registry. Bound methods (``lazy.compile(obj.method)``: every instance
shares the function, but only this one's calls are compiled) and ``nn.Module``s keep a thin Python wrapper, the
``CompiledFunction`` itself, which binds its call's arguments in Python; so does everything on a CPython without the
hook (3.13 and later). ``lazy.compile.reset()`` unregisters every function and disables every wrapper: what was
compiled runs plainly until it is compiled again.
"""
from __future__ import annotations

import inspect
import time
import types
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import _C
from ..cache import graph_cache
from ..config import config
from ..debug import metrics
from ..debug.log import log, log_topic, topic_enabled
from ..device.backing import backing_device
from ..device.tensor import live_storages
from ..ir.node import data_leaf
from ..sync import launch, mark_step, pending_storages
from ..trace import record
from . import expr as X
from .dynamic import Shapes, concrete_result, symbolic_arguments
from .expr import Unsized
from .finalize import finalize
from .interpreter import Box, Interpreter, user_traceback
from .policy import CapturePolicy
from .python_guards import global_state
from .replay import Entry, Miss, Pending
from .session import Break, CaptureBreak, Session
from .symbolic import Recorder
from .tensors import CaptureHooks
from .verify import verified_replay

_ALL: List["CompiledFunction"] = []


class CompiledFunction:
    """What ``lazy.compile(fn)`` returns: callable like ``fn``, capturing on the first call and replaying later."""

    def __init__(self, fn: Callable[..., Any], fullgraph: bool = False, dynamic: bool = False,
                 mode: str = "default", max_recompiles: int = 8) -> None:
        if not callable(fn):
            raise TypeError(f"lazy.compile expects a function or an nn.Module, got {type(fn).__name__}")
        if isinstance(fn, torch.nn.Module):
            self.module: Optional[torch.nn.Module] = fn
            fn = fn.forward
        else:
            self.module = None
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
        if code is not None and code.co_flags & (0x20 | 0x80 | 0x200):
            raise TypeError(f"lazy.compile cannot compile {getattr(fn, '__qualname__', fn)}: it is a generator or "
                            "a coroutine; compile the function that consumes it")
        if mode not in ("default", "reduce-overhead", "max-autotune"):
            raise ValueError(f"lazy.compile: mode must be 'default', 'reduce-overhead' or 'max-autotune', not {mode!r}")
        self.fn = fn
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.mode = mode
        self.max_recompiles = max_recompiles
        self.entries: List[Entry] = []
        self.broken: Optional[Break] = None
        self.events: List[dict] = []  # captures, recompiles, breaks, for lazy.explain(fn)
        self.warned = False
        self.hooked = False  # registered with the frame hook (Note [Compiled functions are themselves])
        self.active = True   # False once lazy.compile.reset() ran: calls run plainly
        self.signature = inspect.signature(fn)
        # Note [Bound arguments]
        # A call's arguments are bound once, in the order of the function's code's argument locals (positional,
        # keyword-only, then *args as a tuple and **kwargs as a dict): the order a frame holds them in, which the
        # frame hook (csrc/) reads directly, and the ``A[i]`` of every guard and replay.
        code = self.code = getattr(fn, "__func__", fn).__code__
        offset = 1 if isinstance(fn, types.MethodType) else 0  # a bound method's self is not an argument here
        nall = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
        self.arg_names = code.co_varnames[offset:nall]
        self.nargs = len(self.arg_names)
        self.simple = not code.co_kwonlyargcount and not code.co_flags & (0x04 | 0x08)
        self.__wrapped__ = fn
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            try:
                setattr(self, attr, getattr(fn, attr))
            except AttributeError:
                pass
        _ALL.append(self)

    def __repr__(self) -> str:
        return f"<lazy.compile of {getattr(self.fn, '__qualname__', self.fn)}>"

    def __get__(self, obj: Any, kind: Any = None) -> Any:
        return self if obj is None else types.MethodType(self, obj)

    # ---- a call ----

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.active or not _capturable_now():
            return self.fn(*args, **kwargs)
        out = self.handle(self._bind(args, kwargs))
        return self.fn(*args, **kwargs) if out is RUN_PLAIN else out

    def handle(self, bound: tuple) -> Any:
        """A call with its arguments bound (Note [Bound arguments]): the result of a replay or of a capture run
        (which is the call itself), or RUN_PLAIN when the caller must run the function plainly. The frame hook
        calls it for every call of a registered function."""
        if not self.active or not _capturable_now():
            return RUN_PLAIN
        for entry in self.entries:
            if entry.check(bound):  # counted in capture.guard_hit by _replay
                out = self._verified(entry, bound, entry.run)
                if out is not _MISSED:
                    return out
        for entry in self.entries:  # Note [Dynamic captures]
            key = entry.shapes.key(bound) if entry.shapes is not None else None
            if key is None:
                continue
            fresh = key not in entry.shapes.variants
            sized = entry.shapes.variant(key, bound)
            if sized is None and fresh:
                self._event("sizes not replayed", f"symbols {key}: {entry.shapes.refused[key]}")
                log_topic("recompiles", f"{self!r}: sizes not replayed: {entry.shapes.refused[key]}")
            if sized is not None:
                out = self._verified(entry, bound, lambda A: entry.shapes.run(A, sized))
                if out is not _MISSED:
                    metrics.bump("capture.dynamic_replays")
                    return out
        metrics.bump("capture.guard_miss" if self.entries else "capture.first_call")
        if self.entries:
            why = self.entries[-1].failures(bound)
            self._event("guard miss", why[0] if why else "a check at replay (inputs that now share storage)")
            log_topic("recompiles", f"{self!r}: guard failed: {why[0] if why else '?'}")
        if self.broken is not None and not self.broken.transient:
            metrics.bump("capture.plain_run")
            return RUN_PLAIN
        if len(self.entries) > self.max_recompiles:
            if not self.warned:
                self.warned = True
                warnings.warn(f"lazy.compile: {self!r} recompiled {self.max_recompiles} times "
                              "(max_recompiles); it runs plainly from now on. lazy.explain(fn) lists why.",
                              stacklevel=3)
            metrics.bump("capture.plain_run")
            return RUN_PLAIN
        return self._capture(bound)

    def run_plainly(self, bound: tuple) -> Any:
        """The function run plainly on bound arguments (as a plain call records it), never through a capture."""
        args, kwargs = self._unbind(bound)
        return _C.capture_call_plain(self.fn, tuple(args), kwargs)  # a frame the hook lets run

    def _unbind(self, bound: tuple) -> Tuple[list, dict]:
        args: list = []
        kwargs: dict = {}
        params = self.signature.parameters
        for name, value in zip(self.arg_names, bound):
            kind = params[name].kind
            if kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
                args.append(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                args.extend(value)
            elif kind is inspect.Parameter.KEYWORD_ONLY:
                kwargs[name] = value
            else:
                kwargs.update(value)
        return args, kwargs

    def _bind(self, args: tuple, kwargs: dict) -> tuple:
        """The call's arguments as the function's frame holds them (Note [Bound arguments])."""
        if not kwargs and len(args) == self.nargs and self.simple:
            return args
        ba = self.signature.bind(*args, **kwargs)
        ba.apply_defaults()
        return tuple(ba.arguments[name] for name in self.arg_names)

    def _verified(self, entry: Entry, bound: tuple, run: Callable[[tuple], Any]) -> Any:
        if config.capture_verify:
            return verified_replay(self, entry, bound, lambda: self._replay(entry, bound, run), _MISSED)
        return self._replay(entry, bound, run)

    def _replay(self, entry: Entry, bound: tuple, run: Callable[[tuple], Any]) -> Any:
        try:
            out = run(bound)
        except Pending:
            mark_step()
            out = run(bound)
        except Miss:
            metrics.bump("capture.guard_hit")
            return _MISSED
        entry.hits += 1
        metrics.bump_many(("capture.guard_hit", 1), ("capture.replays", 1))
        return out

    # ---- capture ----

    def _capture(self, bound: tuple) -> Any:
        start = time.perf_counter()
        if pending_storages():
            mark_step()  # the capture starts from data: its graph's inputs are the storages' values now
        for init in _ONCE_PER_PROCESS:  # Note [torch's one-time caches before a capture]
            init()
        entry_values = {id(st): (st, st.value) for st in live_storages()}
        state = global_state()
        rec, dynamic = None, []
        if self.dynamic:  # Note [Dynamic captures]
            rec, bound, dynamic = symbolic_arguments(bound, self.arg_names)
        s = Session()
        result = None
        try:
            result = self._capture_run(bound, s, state, entry_values, start, rec if dynamic else None, dynamic)
        finally:
            if dynamic:  # Note [Dropping the symbolic recording]
                value = concrete_result(rec, s, result if result is not None else Box(None))
        return value if dynamic else result.v

    def _capture_run(self, bound: tuple, s: Session, state: tuple, entry_values: dict, start: float,
                     rec: Optional[Recorder], dynamic: List[Tuple[int, str]]) -> Box:
        policy = CapturePolicy(s, self.fullgraph)
        interp = Interpreter(policy)  # noqa: F841 -- held for the capture run
        hooks = CaptureHooks(policy)
        pos, kw = self._boxed_arguments(bound, policy)
        previous = record.CAPTURE
        record.CAPTURE = hooks
        CaptureHooks.current = hooks
        try:
            if rec is not None:
                with rec:
                    result = policy.call(Box(self.fn, X.pinned(self.fn)), pos, kw)
            else:
                result = policy.call(Box(self.fn, X.pinned(self.fn)), pos, kw)
        except CaptureBreak as error:
            self.broken = s.broken
            self._event("break", str(s.broken))
            raise CaptureBreak(str(error)) from None
        except BaseException as error:  # the function raised: as a plain call would, with the user's frames
            raise error.with_traceback(user_traceback(error))
        finally:
            record.CAPTURE = previous
            CaptureHooks.current = None
        if global_state() != state:
            policy.breaks("leaves the global state (grad mode, autocast, default dtype) changed")
        for name in s.unbalanced_context_vars():
            policy.breaks(f"leaves the ContextVar {name!r} set (Note [Context variables in a capture])")
        plan = None
        if s.broken is None:
            plan = finalize(s, result, entry_values, policy.breaks)
        entry = None
        if plan is not None and s.broken is None:
            program = self._compile(plan)
            try:
                entry = Entry(s, plan, program, state, policy.breaks)
            except Exception:  # noqa: BLE001 -- a rendering the capture cannot express: run plainly, say why
                if s.broken is None:
                    raise
        if s.broken is not None or entry is None:
            self.broken = s.broken
            metrics.bump("capture.breaks")
            self._event("break", str(s.broken))
            log_topic("graph_breaks", f"{self!r} runs plainly: {s.broken}")
            log(1, f"lazy.compile: {self!r} runs plainly: {s.broken}")
            return result
        if rec is not None and rec.dropped is None and plan.lin is not None:
            try:
                entry.shapes = Shapes(rec, dynamic, s, plan, entry, policy.breaks)
            except Unsized as why:
                rec.dropped = str(why)
        if rec is not None and entry.shapes is None:
            self._event("static sizes", rec.dropped or "no graph")
        _run_capture_graph(plan, entry)
        self.entries.append(entry)
        if len(self.entries) > 1:
            metrics.bump("capture.recompiles")
        metrics.bump("capture.captures")
        elapsed = time.perf_counter() - start
        metrics.bump("capture.time_s", elapsed)
        self._event("capture", f"{entry.num_guards} guards, {len(s.effects)} effects, {len(s.host_ops)} host ops, "
                               f"{entry.num_nodes} nodes, {elapsed:.3f} s")
        log_topic("recompiles" if len(self.entries) > 1 else "captures", f"{self!r}: {self.events[-1]['text']}")
        if topic_enabled("guards"):
            log_topic("guards", f"{self!r}:\n" + "\n".join(f"  {k} {t} == {v!r}" for k, t, v in entry.guards))
        if topic_enabled("output_code"):
            log_topic("output_code", f"{self!r}:\n{entry.check_source}\n{entry.run_source}")
        return result

    def _boxed_arguments(self, bound: tuple, policy: CapturePolicy) -> Tuple[List[Box], Dict[str, Box]]:
        pos: List[Box] = []
        kw: Dict[str, Box] = {}
        params = self.signature.parameters
        for i, name in enumerate(self.arg_names):
            param = params[name]
            value = bound[i]
            e = X.arg(i)
            if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
                pos.append(Box(value, e))
            elif param.kind is param.VAR_POSITIONAL:
                pos.extend(Box(v, X.item(e, j)) for j, v in enumerate(value))
            elif param.kind is param.KEYWORD_ONLY:
                kw[name] = Box(value, e)
            else:
                kw.update({k: Box(v, X.item(e, k)) for k, v in value.items()})
        for b in pos + list(kw.values()):
            policy.reached(b.v, b.m)
        return pos, kw

    def _compile(self, plan: Any) -> Any:
        if plan.lin is None:  # no graph: the function computes nothing on lazy tensors (it returns an input)
            return None
        device = backing_device()
        backend = graph_cache.backend_for(device)
        start = time.perf_counter()
        if self.mode != "default" and backend == "triton":  # Note [CUDA-graph replay]
            from ..runtime.cuda_graph import graphed
            from ..runtime.triton import compile_triton
            # NOTE: as torch.compile's, mode="max-autotune" replays CUDA graphs too, and tries more block sizes
            autotune = "max" if self.mode == "max-autotune" else None  # Note [Tuned block sizes]
            program = graphed(compile_triton(plan.lin, device, tiered=config.compiler == "auto", scalar_memory=True,
                                             autotune=autotune), plan)
        else:
            program = graph_cache.compiler_for(backend)(plan.lin, device)
        metrics.bump("compile_time_s", time.perf_counter() - start)
        metrics.bump("compiles")
        return program

    def _event(self, kind: str, text: str) -> None:
        self.events.append({"kind": kind, "text": text})

    def explain(self) -> str:
        """What happened to this function: its entries (guards, hits), captures, guard misses and why, breaks."""
        lines = [f"lazy.explain({getattr(self.fn, '__qualname__', self.fn)}): {len(self.entries)} entr"
                 f"{'y' if len(self.entries) == 1 else 'ies'}"
                 + (f", runs plainly: {self.broken}" if self.broken is not None and not self.broken.transient else "")]
        for i, entry in enumerate(self.entries):
            sizes = "" if entry.shapes is None else \
                f", symbolic sizes ({len(entry.shapes.variants)} other sizes compiled)"
            lines.append(f"  entry {i}: {entry.num_guards} guards, {entry.num_nodes} nodes, {len(entry.effects)} "
                         f"effects, {entry.hits} replays{sizes}")
        for event in self.events:
            lines.append(f"  {event['kind']}: {event['text']}")
        return "\n".join(lines)


def _run_capture_graph(plan: Any, entry: Entry) -> None:
    """Compute the capture call's graph with the entry's program: its outputs become the data of the storages the
    call changed and of the tensors it created, as a sync would make them."""
    if plan.lin is None:
        return
    launch.ready_all(plan.lin.leaves)
    outs = entry.program.run(plan.lin.leaves, plan.lin.scalars)
    roots = [n for n in plan.lin.outputs]
    values = {id(plan.lin.order[p]): outs[i] for i, p in enumerate(roots)}
    for st in live_storages():
        out = values.get(id(st.value))
        if out is not None:
            st.value = data_leaf(out)
            st.version += 1


_MISSED = object()

# Note [torch's one-time caches before a capture]
# Some torch functions fill a module-level cache on their first call: ``record_function`` (around every optimizer's
# ``step``) looks for the CUPTI monitor once, setting ``torch.autograd.profiler._cupti_monitor_checked``. A capture
# that makes the process's first such call guards the flag's old value and replays the write, so the next call
# misses its guard and captures again (an SGD step over existing gradients: two captures instead of one). They are
# filled before a capture, as that first call would fill them: idempotent, and the capture then sees the value
# every later call sees.
_ONCE_PER_PROCESS = tuple(f for f in (getattr(torch.autograd.profiler, "_maybe_cupti_monitor", None),) if f)


class _RunPlain:
    def __repr__(self) -> str:
        return "RUN_PLAIN"


RUN_PLAIN = _RunPlain()  # what ``handle`` returns when the function must run plainly
HOOK = _C.capture_hook_supported()  # CPython 3.11, 3.12: the frame hook (csrc/capture_hook.cpp)
_C.capture_configure(RUN_PLAIN)


_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_transforms = torch._C._are_functorch_transforms_active


def _capturable_now() -> bool:
    """Capture and replay only where a plain call would record exactly: no dispatch or function modes, no functorch
    transforms, not inside another capture."""
    return not (_dispatch_modes() or _function_modes() or _transforms() or record.CAPTURE is not None)


def compile(fn: Optional[Callable[..., Any]] = None, *, fullgraph: bool = False, dynamic: bool = False,
            mode: str = "default", max_recompiles: int = 8) -> Any:
    """Capture ``fn`` (a function, a method, or an nn.Module's forward) on its first call and replay it later.
    A plain function is returned itself, its calls intercepted by the frame hook (Note [Compiled functions are
    themselves]); a bound method or a module is returned wrapped."""
    if fn is None:
        return lambda f: compile(f, fullgraph=fullgraph, dynamic=dynamic, mode=mode, max_recompiles=max_recompiles)
    cf = CompiledFunction(fn, fullgraph, dynamic, mode, max_recompiles)
    if type(fn) is not types.FunctionType or not HOOK:
        return cf
    previous = _C.capture_handler(fn)
    if previous is not None:  # compiled again (new options): the new state replaces the old one
        _ALL.remove(previous.__self__)
    _C.capture_register(fn, cf.handle)
    cf.hooked = True
    return fn


def state_of(fn: Any) -> "CompiledFunction":
    """The capture state of a function given to ``lazy.compile``."""
    if isinstance(fn, CompiledFunction):
        return fn
    target = getattr(fn, "__func__", fn)
    if HOOK and type(target) is types.FunctionType:
        handler = _C.capture_handler(target)
        if handler is not None:
            return handler.__self__
    for cf in _ALL:
        if cf.fn is fn or getattr(cf.fn, "__func__", None) is fn or cf.module is fn:
            return cf
    raise ValueError(f"lazy.explain: {fn!r} was not given to lazy.compile (or lazy.compile.reset() ran since)")


def reset() -> None:
    """Forget every capture and unregister every compiled function: what was compiled runs plainly until it is
    compiled again."""
    for cf in _ALL:
        cf.entries.clear()
        cf.broken = None
        cf.warned = False
        cf.active = False
        if cf.hooked:
            _C.capture_unregister(cf.fn)
            cf.hooked = False
    _ALL.clear()


compile.reset = reset  # type: ignore[attr-defined]
_ = (config, Session)

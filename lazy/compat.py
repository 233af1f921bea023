"""``torch._lazy`` acting on this runtime: code written for PyTorch's LazyTensorCore runs on the lazy device.

The device is PyTorch's own ``lazy`` device type, so code written for LTC, and PyTorch's own test helpers, call
``torch._lazy``'s Python API: ``torch.testing._utils.wrapper_set_seed``, behind every random OpInfo of ``op_db``,
calls ``torch._lazy.mark_step()`` when an output is a lazy tensor. That API is a thin layer over LTC's C++ core
(``torch._C._lazy``), which refuses every call when no LTC backend is registered ("Lazy tensor backend not
registered"), and registering one (``torch._lazy.ts_backend.init()``) would take the ``Lazy`` dispatch key from
this runtime.

Note [torch._lazy on this runtime]
``install()`` (run by ``import lazy``) imports the real ``torch._lazy`` package and points its entry points at
lazy: ``mark_step``, ``wait_device_ops``, ``sync_multi`` (and through it ``to_cpu`` and ``save``), step closures,
``metrics`` (the counters ``lazy.metrics`` keeps), ``ir_cache.reset`` (the graph cache), ``debug.dump_ir(...,
"text")`` (the pending IR), and makes ``ts_backend.init()`` leave this runtime in place. The rest is LTC's own
machinery (TorchScript graphs, its IR cache's DOT dump, fallback configuration, tensor ids): each raises a
``NotImplementedError`` that says so and what to use instead. The real package is patched, not replaced, so
``import torch._lazy.metrics`` and ``from torch._lazy import mark_step`` (after ``import lazy``) both see lazy's
functions, whichever imports come first after that.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, List, Optional, Sequence

import torch

from . import sync
from .cache import graph_cache
from .debug import metrics
from .debug.log import log
from .ir.graph import format_graph, linearize
from .trace.views import value

_closures: List[Callable[[], Any]] = []


def mark_step(device: str = "", wait: bool = False) -> None:
    """``torch._lazy.mark_step``: ``lazy.mark_step()``, then the step closures; ``wait=True`` also waits for the
    launched work."""
    sync.mark_step()
    if wait:
        sync.wait_device_ops()
    run_step_closures()


def wait_device_ops(devices: Optional[Sequence[str]] = None) -> None:
    sync.wait_device_ops()


def sync_multi(tensors: Sequence[torch.Tensor], devices: Sequence[str]) -> None:
    """Compute the given lazy tensors in one graph (``to_cpu`` and ``save`` come through here)."""
    sync.sync_tensors(list(tensors), "sync_multi")


def add_step_closure(closure: Callable[..., Any], args: tuple = (), run_async: bool = False) -> None:
    """Run ``closure(*args)`` at the end of the next ``torch._lazy.mark_step()`` (in order, on this thread)."""
    _closures.append(lambda: closure(*args))


def run_step_closures() -> None:
    while _closures:
        _closures.pop(0)()


def _dump_ir(tensors: Sequence[torch.Tensor], ir_format: str) -> str:
    if ir_format != "text":
        _unsupported(f"debug.dump_ir(..., {ir_format!r})", "lazy's IR has a text form only: dump_ir(tensors, 'text'), "
                     "or LAZY_DUMP_DIR for the IR, kernel IR and generated source of every compiled graph")
    lin = linearize([value(t) for t in tensors])
    return format_graph(lin.order, lin.outputs)


def _ir_cache_reset() -> None:
    graph_cache.clear()


def _ts_backend_init() -> None:
    # Note [torch._lazy on this runtime]: lazy already serves the lazy device; LTC's TorchScript backend would take
    # the Lazy dispatch key from it.
    log(1, "torch._lazy.ts_backend.init(): the lazy device is served by lazy; LTC's TorchScript backend is not loaded")


def _unsupported(what: str, instead: str) -> None:
    raise NotImplementedError(f"torch._lazy.{what} is part of LazyTensorCore's own machinery, which this process "
                              f"does not run (the lazy device is served by lazy): {instead}")


def _refusal(what: str, instead: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        _unsupported(what, instead)
    refuse.__name__ = what.rsplit(".", 1)[-1]
    refuse.__doc__ = f"Not available on lazy: {instead}"
    return refuse


def _counter_value(name: str) -> Optional[float]:
    return metrics.counters().get(name)


# module of torch._lazy -> {name: replacement}
def _table() -> dict:
    graph = "lazy.metrics, lazy.explain() or LAZY_DUMP_DIR"
    return {
        "": {"mark_step": mark_step, "wait_device_ops": wait_device_ops, "sync_multi": sync_multi,
             "add_step_closure": add_step_closure, "run_step_closures": run_step_closures,
             "get_tensor_id": _refusal("get_tensor_id", "lazy tensors have no LTC ids; use id(tensor)")},
        "closure": {"add_step_closure": add_step_closure, "run_step_closures": run_step_closures},
        "metrics": {"reset": metrics.reset, "counter_names": lambda: list(metrics.counters()),
                    "counter_value": _counter_value, "metrics_report": metrics.report},
        "ts_backend": {"init": _ts_backend_init},
        "ir_cache": {"reset": _ir_cache_reset,
                     "dump": _refusal("ir_cache.dump",
                                      "lazy.explain() lists compiled graphs; LAZY_DUMP_DIR writes them")},
        "debug": {"dump_ir": _dump_ir,
                  "render_ir_graph": _refusal("debug.render_ir_graph", "debug.dump_ir(tensors, 'text') or " + graph)},
        "config": {name: _refusal(f"config.{name}", "lazy.config holds this runtime's knobs")
                   for name in ("get_force_fallback", "set_force_fallback", "set_reuse_ir")},
        "computation": {name: _refusal(f"computation.{name}", "lazy compiles graphs itself; " + graph)
                        for name in ("get_tensors_ts_device_data_node", "get_graph_hash", "run_cached_graph")},
        "extract_compiled_graph": {"extract_compiled_graph": _refusal(
            "extract_compiled_graph.extract_compiled_graph", "use @lazy.compile or torch.compile, not both on lazy")},
    }


def install() -> None:
    """Point ``torch._lazy``'s entry points at this runtime (Note [torch._lazy on this runtime])."""
    for sub, names in _table().items():
        try:
            module = importlib.import_module("torch._lazy" + ("." + sub if sub else ""))
        except ImportError:  # a torch without this part of the package: nothing to point anywhere
            continue
        for name, fn in names.items():
            setattr(module, name, fn)

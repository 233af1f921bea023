"""lazy's layers import only the layers below them (Note [Layers] in lazy/device/tensor.py).

Every import of every module of the package is checked, also imports inside functions: a lower layer that needs a
higher one's behaviour gets it installed by that layer, never by importing it.
"""
import ast
import pathlib

import lazy

ROOT = pathlib.Path(lazy.__file__).parent

# package (or top-level module) -> layer; a module may import its own layer and those below it. Recording (trace)
# and the compiler stack (lower, schedule, codegen, runtime, cache) both sit on the device and import neither each
# other nor anything above.
LAYERS = {
    "_C": 0, "config": 0, "debug": 0,
    "ir": 1, "debug.explain": 1,  # explain reads graphs (why a graph missed the cache)
    "device": 2,
    "trace": 3,
    "lower": 3.5, "schedule": 3.5, "codegen": 3.5, "runtime": 3.5, "cache": 3.5,
    "sync": 4,
    "capture": 5, "compat": 5, "distributed": 5,
    "__init__": 6,
}
COMPILER_STACK = {"lower", "schedule", "codegen", "runtime", "cache"}


def _package(module: str) -> str:
    return module.split(".")[0]


def _imports(path: pathlib.Path):
    """(line, imported lazy module relative to the package) for every import in the file, at any depth."""
    here = path.relative_to(ROOT).with_suffix("").parts
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("lazy."):
                    yield node.lineno, node.module[len("lazy."):]
                continue
            base = list(here[:len(here) - node.level])  # the package the relative import starts from
            target = ".".join(base + ([node.module] if node.module else []))
            if target:
                yield node.lineno, target
            else:  # ``from . import x`` at the top of the package
                for alias in node.names:
                    yield node.lineno, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lazy."):
                    yield node.lineno, alias.name[len("lazy."):]


def _layer(name: str) -> float:
    return LAYERS.get(name, LAYERS[_package(name)])


def test_every_module_has_a_layer():
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        assert _package(name) in LAYERS, f"lazy/{path.relative_to(ROOT)}: add its package to LAYERS"


def test_no_module_imports_a_layer_above_it():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mine = _package(name)
        for line, target in _imports(path):
            theirs = _package(target)
            if theirs == mine:
                continue
            sideways = (mine == "trace" and theirs in COMPILER_STACK) or (mine in COMPILER_STACK and theirs == "trace")
            if _layer(target) > _layer(name) or sideways:
                wrong.append(f"lazy/{path.relative_to(ROOT)}:{line} ({mine}) imports lazy.{target} ({theirs})")
    assert not wrong, "imports across layers (Note [Layers]):\n" + "\n".join(wrong)

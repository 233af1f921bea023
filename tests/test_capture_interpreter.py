"""The capture interpreter runs Python as CPython does (lazy/capture/interpreter.py, opcodes.py).

Each function here runs natively and under the interpreter with its transparent policy, and every result, every
side effect and every exception (type, message, context) must agree. The functions cover the bytecode a training
step executes: calls of every shape, closures, generators and ``yield from``, comprehensions, ``with``, try/except/
finally, ``super()``, unpacking, f-strings; and whole training steps of torch.nn modules and torch.optim optimizers.
The same file runs under another CPython found on the machine (3.11 and 3.12 differ in bytecode) without torch.
"""
import os
import shutil
import subprocess
import sys

import pytest

from lazy.capture import interpreter as I
from lazy.capture.plain_policy import Policy

from capture_cases import CASES, Base, outcome


def interpret(fn, *args, **kwargs):
    it = I.Interpreter(Policy())
    return it.policy.call(I.Box(fn), [I.Box(a) for a in args], {k: I.Box(v) for k, v in kwargs.items()}).v


@pytest.mark.parametrize("fn,args,kwargs", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_interpreted_equals_native(fn, args, kwargs):
    assert outcome(interpret, fn, *args, **kwargs) == outcome(fn, *args, **kwargs)


def test_side_effects_match():
    def mutate(lst, d, obj):
        lst.append(len(lst))
        d["n"] = d.get("n", 0) + 1
        obj.x += 1
        del lst[0]
        return lst, d

    native = ([1, 2], {}, Base(1))
    interp = ([1, 2], {}, Base(1))
    assert mutate(*native) == interpret(mutate, *interp)
    assert native[2].x == interp[2].x == 2


def test_unsupported_code_is_refused_before_it_runs():
    def with_class():
        class Local:
            pass
        return Local

    assert not I.decode(with_class.__code__).supported
    assert "LOAD_BUILD_CLASS" in I.decode(with_class.__code__).why


def _torch_step(kind, opt_name, interpreted):
    import torch

    from models import MODELS, batch, loss_fn
    torch.manual_seed(0)
    model = MODELS[kind]()
    opt = (torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True) if opt_name == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=3e-3))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5)

    def step(x, y):
        loss = loss_fn(kind, model(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        return loss.detach()

    losses = [(interpret(step, *batch(kind, s)) if interpreted else step(*batch(kind, s))).item() for s in range(3)]
    return losses, [p.detach().clone() for p in model.parameters()], opt.param_groups[0]["lr"]


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
@pytest.mark.parametrize("kind", ["mlp", "cnn", "encoder", "gpt"])
def test_training_steps_of_torch_interpret_identically(kind, opt_name):
    """torch.nn's modules, autograd's backward, clipping, torch.optim and a scheduler, interpreted on eager cpu
    tensors: bit-identical to running them natively."""
    import torch
    want = _torch_step(kind, opt_name, False)
    got = _torch_step(kind, opt_name, True)
    assert got[0] == want[0] and got[2] == want[2]
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


def _other_pythons():
    """CPython 3.11/3.12 executables other than this one's version (on PATH or under pyenv), that really run."""
    candidates = [shutil.which(n) for n in ("python3.11", "python3.12")]
    pyenv = os.path.expanduser("~/.pyenv/versions")
    if os.path.isdir(pyenv):
        for v in sorted(os.listdir(pyenv)):
            if v.startswith(("3.11.", "3.12.")):
                candidates.append(f"{pyenv}/{v}/bin/python{v[:4]}")
    found = {}
    for path in candidates:
        if not path or not os.path.exists(path):
            continue
        try:
            out = subprocess.run([path, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
                                 capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        version = tuple(int(x) for x in out.stdout.split()) if out.returncode == 0 else None
        if version and version != tuple(sys.version_info[:2]) and version not in found:
            found[version] = path
    return list(found.values())


_OTHER = """
import importlib.util, sys, types
capture, tests = sys.argv[1], sys.argv[2]
for name in ("lazy", "lazy.capture"):
    module = types.ModuleType(name)
    module.__path__ = [capture] if name == "lazy.capture" else []
    sys.modules[name] = module
for name in ("interpreter", "plain_policy", "opcodes"):
    spec = importlib.util.spec_from_file_location("lazy.capture." + name, capture + "/" + name + ".py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["lazy.capture." + name] = module
    spec.loader.exec_module(module)
sys.path.insert(0, tests)
import capture_cases as C
I = sys.modules["lazy.capture.interpreter"]
P = sys.modules["lazy.capture.plain_policy"]

def interpret(fn, *args, **kwargs):
    it = I.Interpreter(P.Policy())
    return it.policy.call(I.Box(fn), [I.Box(a) for a in args], {k: I.Box(v) for k, v in kwargs.items()}).v

bad = [c[0].__name__ for c in C.CASES if C.outcome(interpret, c[0], *c[1], **c[2]) != C.outcome(c[0], *c[1], **c[2])]
print("MISMATCH", bad)
"""


@pytest.mark.parametrize("python", _other_pythons() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no other CPython 3.11/3.12 on this machine"))])
def test_the_pure_python_cases_under_another_python(python):
    """3.11 and 3.12 differ in bytecode: the pure-Python cases run under the other version too, with only the
    interpreter's modules loaded (no torch there)."""
    here = os.path.dirname(os.path.abspath(__file__))
    capture = os.path.join(os.path.dirname(here), "lazy", "capture")
    out = subprocess.run([python, "-c", _OTHER, capture, here], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "MISMATCH []" in out.stdout, out.stdout

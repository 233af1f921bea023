"""The frame hook of lazy.compile (csrc/capture_hook.cpp): compiled functions are themselves, their calls are
intercepted from anywhere, and everything else runs as plain Python does.

Every replay is verified against a plain run (LAZY_CAPTURE_VERIFY) and compared with eager; counters prove what ran.
"""
import os
import shutil
import subprocess
import sys
import threading
import traceback

import pytest
import torch
import torch.nn as nn

import lazy
from lazy import _C
from lazy.capture.function import state_of
from lazy.debug.metrics import counter

L = "lazy"

pytestmark = [pytest.mark.skipif(not _C.capture_hook_supported(), reason="the frame hook needs CPython 3.11 or 3.12"),
              pytest.mark.usefixtures("capture_verified")]


def _double_sum(x):
    return (x * 2).sum()


def test_compile_returns_the_function_and_installs_the_hook_while_one_is_registered():
    def f(x):
        return x * 3

    assert not _C.capture_hook_installed()
    assert lazy.compile(f) is f
    assert lazy.compile(fullgraph=True)(_double_sum) is _double_sum
    assert _C.capture_hook_installed()
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(f(x.to(L)).cpu(), x * 3)
    assert counter("capture.captures") == 1 and counter("capture.replays") == 2
    assert state_of(f).entries[0].hits == 2 and "1 entry" in lazy.explain(f)
    lazy.compile.reset()
    assert not _C.capture_hook_installed()
    with pytest.raises(ValueError, match="not given to lazy.compile"):
        state_of(f)
    torch.testing.assert_close(f(x.to(L)).cpu(), x * 3)  # a plain function again
    assert counter("capture.replays") == 2 and counter("capture.captures") == 1


def test_unregistered_function_runs_plainly_and_a_plain_call_is_not_intercepted():
    f = lazy.compile(_double_sum)
    x = torch.randn(3)
    f(x.to(L))
    f(x.to(L))
    assert counter("capture.replays") == 1
    _C.capture_call_plain(f, (x.to(L),), {})  # the plain run of a verification: recorded, not replayed
    assert counter("capture.replays") == 1
    assert _C.capture_unregister(f) and not _C.capture_hook_installed()
    torch.testing.assert_close(f(x.to(L)).cpu(), (x * 2).sum())
    assert counter("capture.replays") == 1 and counter("capture.guard_hit") == 1


def test_a_call_from_anywhere_is_intercepted():
    """A reference taken before compiling, a call through map() (from C), a call by keyword."""
    def f(x, scale=1.0):
        return x * scale

    early = f
    lazy.compile(f)
    x = torch.randn(3)
    outs = [early(x.to(L), 2.0), *map(f, [x.to(L)]), f(x=x.to(L), scale=3.0)]
    for got, want in zip(outs, (x * 2, x, x * 3)):
        torch.testing.assert_close(got.cpu(), want)
    assert counter("capture.captures") == 1 and counter("capture.replays") == 2


def test_compiled_calling_compiled_from_a_plain_run():
    """outer breaks (it syncs), so it runs plainly; inner, called from that plain frame, replays."""
    @lazy.compile
    def inner(x):
        return x.sin() * 2

    @lazy.compile
    def outer(x):
        y = inner(x)
        return y * float(y.sum().item() > -1e9)

    for _ in range(4):  # 1: outer's capture interprets inner, and breaks; 2: inner captures; 3, 4: inner replays
        x = torch.randn(5)
        torch.testing.assert_close(outer(x.to(L)).cpu(), x.sin() * 2)
    assert state_of(outer).broken is not None and not state_of(outer).entries
    assert state_of(inner).entries[0].hits == 2


def test_recursion():
    @lazy.compile
    def power(x, n):
        return x if n == 1 else x * power(x, n - 1)

    x = torch.randn(4)
    for n in (3, 3, 3, 4, 4, 1):
        torch.testing.assert_close(power(x.to(L), n).cpu(), x ** n, rtol=1e-5, atol=1e-6)
    assert counter("capture.captures") == 3 and counter("capture.replays") == 3  # n is guarded: one per n


def test_deep_recursion_of_a_function_that_runs_plainly():
    @lazy.compile
    def depth(x, n):
        if n == 0:
            return x.sum().item()  # a sync: every frame runs plainly after the first call breaks
        return depth(x, n - 1)

    x = torch.ones(3).to(L)
    assert depth(x, 3) == 3.0 and state_of(depth).broken is not None  # the capture interprets 3 levels
    assert depth(x, 300) == 3.0  # 300 frames through the hook, each run plainly


def test_threads_share_the_captures():
    @lazy.compile
    def f(x, y):
        return (x * y).relu() + 1

    x, y = torch.randn(8), torch.randn(8)
    f(x.to(L), y.to(L))
    errors = []

    def work():
        try:
            for _ in range(5):
                torch.testing.assert_close(f(x.to(L), y.to(L)).cpu(), (x * y).relu() + 1)
        except BaseException as e:  # noqa: BLE001 -- reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert counter("capture.captures") == 1 and counter("capture.replays") == 20


def _fails_on_odd(x, n):
    y = x * 2
    if n % 2:
        raise ValueError(f"odd {n}")
    return y


def test_exceptions_carry_the_users_lines():
    f = lazy.compile(_fails_on_odd)
    with pytest.raises(ValueError, match="odd 1") as info:  # raised by the capture run
        f(torch.ones(2).to(L), 1)
    text = "".join(traceback.format_exception(info.value))
    assert "f(torch.ones(2).to(L), 1)" in text  # the caller's line
    assert 'raise ValueError(f"odd {n}")' in text and "in _fails_on_odd" in text
    torch.testing.assert_close(f(torch.ones(2).to(L), 2).cpu(), torch.full((2,), 2.0))
    torch.testing.assert_close(f(torch.ones(2).to(L), 4).cpu(), torch.full((2,), 2.0))
    assert counter("capture.replays") == 1  # n % 2 is guarded; the failed call kept no entry


def test_exceptions_of_a_plain_run_come_from_the_real_frame():
    @lazy.compile
    def f(x):
        if x.sum().item() > 0:  # breaks: runs plainly
            raise KeyError("positive")
        return x

    f(-torch.ones(2).to(L))
    with pytest.raises(KeyError) as info:
        f(torch.ones(2).to(L))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].name == "f" and frames[-1].line == 'raise KeyError("positive")'


def test_generators_are_left_alone():
    f = lazy.compile(_double_sum)

    def gen(xs):
        for x in xs:
            yield f(x)

    xs = [torch.randn(3) for _ in range(3)]
    for got, x in zip(gen([x.to(L) for x in xs]), xs):
        torch.testing.assert_close(got.cpu(), (x * 2).sum())
    assert counter("capture.replays") == 2

    def g(x):
        yield x

    with pytest.raises(TypeError, match="generator"):
        lazy.compile(g)
    assert list(g(1)) == [1]


def test_closures_of_one_def_keep_their_own_captures():
    def make(k):
        def scaled(x):
            return x * k
        return scaled

    a, b, c = make(2.0), make(3.0), make(5.0)
    assert a.__code__ is b.__code__
    lazy.compile(a)
    lazy.compile(b)
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(a(x.to(L)).cpu(), x * 2)
        torch.testing.assert_close(b(x.to(L)).cpu(), x * 3)
        torch.testing.assert_close(c(x.to(L)).cpu(), x * 5)  # not compiled: plain
    assert state_of(a) is not state_of(b)
    assert state_of(a).entries[0].hits == 2 and state_of(b).entries[0].hits == 2
    assert counter("capture.captures") == 2
    with pytest.raises(ValueError):
        state_of(c)


def test_methods():
    class M(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.k = k

        @lazy.compile
        def scaled(self, x):
            return self.lin(x) * self.k

        def plain(self, x):
            return self.lin(x) + self.k

    m1, m2 = M(2.0).to(L), M(3.0).to(L)
    x = torch.randn(2, 3)
    want = {id(m): (x @ m.lin.weight.detach().cpu().t() + m.lin.bias.detach().cpu()) for m in (m1, m2)}
    with torch.no_grad():
        for m in (m1, m1, m2, m2):
            torch.testing.assert_close(m.scaled(x.to(L)).cpu(), want[id(m)] * m.k)
        assert state_of(m1.scaled) is state_of(M.scaled)
        bound = lazy.compile(m1.plain)  # a bound method: a wrapper, m2.plain stays plain
        assert bound is not m1.plain
        for _ in range(2):
            torch.testing.assert_close(bound(x.to(L)).cpu(), want[id(m1)] + 2.0)
            torch.testing.assert_close(m2.plain(x.to(L)).cpu(), want[id(m2)] + 3.0)
    assert counter("capture.replays") == 3  # scaled: m1 again, m2 again (modules are guarded by identity); bound


def test_code_executed_as_in_a_repl():
    ns = {"lazy": lazy}
    exec(compile("@lazy.compile\ndef f(x):\n    return x.cos() + 1\n", "<stdin>", "exec"), ns)  # noqa: S102
    x = torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(ns["f"](x.to(L)).cpu(), x.cos() + 1)
    assert counter("capture.replays") == 1


def test_torch_compile_beside_the_hook():
    """torch._dynamo installs its own frame evaluation function around a compiled call and puts back the one it found:
    lazy's hook keeps intercepting before, after and between."""
    f = lazy.compile(_double_sum)
    x = torch.randn(3)
    f(x.to(L))
    tc = torch.compile(lambda y: f(y) + 1, backend="eager")  # f on cpu tensors, traced by Dynamo
    torch.testing.assert_close(tc(x), (x * 2).sum() + 1)
    assert _C.capture_hook_installed()
    torch.testing.assert_close(f(x.to(L)).cpu(), (x * 2).sum())
    torch.testing.assert_close(tc(x), (x * 2).sum() + 1)
    torch.testing.assert_close(f(x.to(L)).cpu(), (x * 2).sum())
    assert counter("capture.replays") == 2


def test_the_hook_leaves_frames_it_returns_from_released():
    """A replayed call's frame is never run: its arguments and its code are released all the same."""
    f = lazy.compile(_double_sum)
    x = torch.randn(3).to(L)
    f(x)
    f(x)
    refs = (sys.getrefcount(_double_sum.__code__), sys.getrefcount(x))
    for _ in range(20):
        f(x)
    # never more: one leaked reference per call would be 20 (on cuda a tiered compile may still hold an early
    # call's input when ``refs`` is counted, and let it go later)
    code, arg = sys.getrefcount(_double_sum.__code__), sys.getrefcount(x)
    assert code == refs[0] and arg <= refs[1], (code, arg, refs)


_HARNESS = r"""
#include "capture_hook.h"
#define FASTCALL(fn) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fn))
static PyMethodDef methods[] = {
    {"supported", lazy::capture_hook_supported, METH_NOARGS, ""},
    {"installed", lazy::capture_hook_installed, METH_NOARGS, ""},
    {"configure", lazy::capture_configure, METH_O, ""},
    {"register", FASTCALL(lazy::capture_register), METH_FASTCALL, ""},
    {"unregister", lazy::capture_unregister, METH_O, ""},
    {"call_plain", FASTCALL(lazy::capture_call_plain), METH_FASTCALL, ""},
    {nullptr, nullptr, 0, nullptr}};
static PyModuleDef module = {PyModuleDef_HEAD_INIT, "hook", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_hook(void) { return PyModule_Create(&module); }
"""

_HOOK_CASES = r"""
import gc, sys, threading
import hook as C
assert C.supported() and not C.installed()
RUN_PLAIN = object()
C.configure(RUN_PLAIN)

class Counted:
    alive = 0
    def __init__(self): Counted.alive += 1
    def __del__(self): Counted.alive -= 1

def f(a, b=2, *rest, c, **kw):
    return ("plain", a, b, rest, c, kw)

C.register(f, lambda bound: RUN_PLAIN if bound[0] == 0 else ("hooked", len(bound)))
assert C.installed()
assert f(1, c=3) == ("hooked", 5)
assert f(0, 5, 6, c=7, z=1) == ("plain", 0, 5, (6,), 7, {"z": 1})
code_refs, fn_refs = sys.getrefcount(f.__code__), sys.getrefcount(f)
for _ in range(1000):
    f(Counted(), c=Counted())
gc.collect()
assert Counted.alive == 0 and (sys.getrefcount(f.__code__), sys.getrefcount(f)) == (code_refs, fn_refs)

source = "def big(x):\n" + "".join(f"    v{i} = x\n" for i in range(3000)) + "    return 'plain'\n"
scope = {}
exec(source, scope)
big = scope["big"]  # a frame larger than a data-stack chunk: always the first frame of a new chunk
C.register(big, lambda bound: ("hooked", bound[0]) if bound[0] else RUN_PLAIN)
assert all(big(i) == ("hooked", i) for i in range(1, 5000)) and big(0) == "plain"

def g(x):
    return "plain"
def raising(bound):
    raise ValueError("from the handler")
C.register(g, raising)
try:
    g(1)
    raise AssertionError("no exception")
except ValueError as e:
    assert str(e) == "from the handler"

def r(n):
    return n
C.register(r, lambda bound: 0 if bound[0] == 0 else 1 + r(bound[0] - 1))
assert r(50) == 50

def make(k):
    def scaled(x):
        return ("plain", k * x)
    return scaled
a, b = make(2), make(3)
C.register(a, lambda bound: ("a", bound))
assert a(5) == ("a", (5,)) and b(5) == ("plain", 15)

def gen(x):
    yield f(1, c=x)
    yield x
assert list(gen(3)) == [("hooked", 5), 3]
assert C.call_plain(f, (1,), {"c": 2}) == ("plain", 1, 2, (), 2, {})

results = []
def work():
    for i in range(2000):
        results.append(f(1, c=i)[0])
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert results == ["hooked"] * 8000
for fn in (f, big, g, r, a):
    assert C.unregister(fn)
assert not C.installed() and f(1, c=3) == ("plain", 1, 2, (), 3, {})
print("HOOK OK", sys.version_info[:2])
"""


def _other_pythons():
    from test_capture_interpreter import _other_pythons as find
    return find()


@pytest.mark.parametrize("python", _other_pythons() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no other CPython 3.11/3.12 on this machine"))])
def test_the_hook_under_another_cpython(python, tmp_path):
    """3.11 and 3.12 dispose of a frame that is not run differently (Note [The frame hook]): the hook, built alone
    for another CPython found on the machine, intercepts, releases and unwinds there too."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++")
    csrc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")
    info = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['include']); "
                           "print(sysconfig.get_config_var('EXT_SUFFIX'))"], capture_output=True, text=True)
    include, suffix = info.stdout.split()
    (tmp_path / "harness.cpp").write_text(_HARNESS)
    build = subprocess.run([compiler, "-std=c++20", "-O2", "-shared", "-fPIC", f"-I{include}", f"-I{csrc}",
                            str(tmp_path / "harness.cpp"), os.path.join(csrc, "capture_hook.cpp"),
                            "-o", str(tmp_path / f"hook{suffix}")], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    out = subprocess.run([python, "-c", _HOOK_CASES], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "HOOK OK" in out.stdout, out.stderr[-3000:]

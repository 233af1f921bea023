"""The frame hook of lazy.compile (csrc/capture_hook.cpp): compiled functions are themselves, their calls are
intercepted from anywhere, and everything else runs as plain Python does.

Every replay is verified against a plain run (LAZY_CAPTURE_VERIFY) and compared with eager; counters prove what ran.
"""
import sys
import threading
import traceback

import pytest
import torch
import torch.nn as nn

import lazy
from lazy import _C
from lazy.capture.function import state_of

L = "lazy"

pytestmark = pytest.mark.skipif(not _C.capture_hook_supported(), reason="the frame hook needs CPython 3.11 or 3.12")


def counter(name):
    return lazy.metrics.counter(name)


@pytest.fixture(autouse=True)
def verified_and_forgotten():
    with lazy.config.override(capture_verify=True):
        yield
    lazy.compile.reset()


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


def test_the_hook_leaves_frames_it_returns_from_released():
    """A replayed call's frame is never run: its arguments and its code are released all the same."""
    f = lazy.compile(_double_sum)
    x = torch.randn(3).to(L)
    f(x)
    f(x)
    refs = (sys.getrefcount(_double_sum.__code__), sys.getrefcount(x))
    for _ in range(20):
        f(x)
    assert (sys.getrefcount(_double_sum.__code__), sys.getrefcount(x)) == refs

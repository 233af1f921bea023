"""Python containers and context variables a captured function reads and writes (lazy/capture/policy.py's item
reads and stores, lazy/capture/method_models.py's ContextVar models): replays equal a plain run, and what a replay
cannot redo breaks and runs plainly."""
import collections
import contextvars

import pytest
import torch

import lazy
from lazy.debug.metrics import counter

pytestmark = pytest.mark.usefixtures("capture_verified")

L = "lazy"


class Holder:
    def __init__(self):
        self.shape = torch.Size([3, 4, 5])
        self.items = [1.0, 2.0, 3.0]


def test_slices_of_sequences_from_the_inputs_replay():
    """A slice of a tuple (a torch.Size) or list reached from the inputs reads each item as its own read would:
    an item the call stored before reads back the stored value."""
    h = Holder()

    @lazy.compile
    def f(x, h):
        out = x.reshape((-1,) + h.shape[1:])  # HF GPT-2's ``(-1,) + input_shape[1:]``
        h.items[-1] = h.items[0] + 1.0  # the last item, by a negative index
        first, last = h.items[0:3:2]
        return out * first + h.items[2] * last

    x = torch.randn(3, 4, 5)
    for i in range(4):
        h.items[0] = float(i)
        want_items = [float(i), 2.0, float(i) + 1.0]
        got = f(x.to(L), h)
        torch.testing.assert_close(got.cpu(), x * float(i) + (i + 1.0) ** 2)
        assert h.items == want_items
    assert counter("capture.captures") == 1 and counter("capture.replays") == 3


def test_a_slice_store_or_a_list_deletion_on_the_inputs_breaks_and_runs_plainly():
    """A store into a slice, or a deletion, moves other items of a list the replay would read at their old places:
    the function runs plainly, with a plain run's results."""
    def store(x, items):
        items[0:2] = [items[1], items[0]]
        return x * items[0]

    def delete(x, items):
        del items[0]
        return x * items[0]

    x = torch.randn(3)
    for fn, want in ((store, [2.0, 1.0, 3.0]), (delete, [2.0, 3.0])):
        f = lazy.compile(fn)
        items = [1.0, 2.0, 3.0]
        torch.testing.assert_close(f(x.to(L), items).cpu(), x * 2.0)
        assert items == want
        assert "runs plainly" in lazy.explain(f)
    assert counter("capture.replays") == 0


_collector = contextvars.ContextVar("collector", default=None)


def _scaled(x):
    collected = _collector.get()
    if collected is not None:
        collected.append(x)
    return x * 2


def test_a_context_variable_set_and_reset_around_the_work_replays():
    """Note [Context variables in a capture]: a library's ContextVar set for the length of a call (transformers'
    output collector) is followed by the capture; a get before the set reads the entry value, guarded."""
    @lazy.compile
    def f(x):
        before = _scaled(x)  # the entry value: None
        token = _collector.set([])
        try:
            y = _scaled(x + 1)
            collected = _collector.get()
        finally:
            _collector.reset(token)
        return before + y + collected[0]

    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(f(x.to(L)).cpu(), x * 2 + (x + 1) * 2 + (x + 1))
        assert _collector.get() is None
    assert counter("capture.captures") == 1 and counter("capture.replays") == 2
    seen = []
    token = _collector.set(seen)  # a caller's collector: the entry value's guard fails, the call captures again
    try:
        torch.testing.assert_close(f(x.to(L)).cpu(), x * 2 + (x + 1) * 2 + (x + 1))
    finally:
        _collector.reset(token)
    assert counter("capture.captures") == 2 and len(seen) == 1


def test_a_context_variable_left_set_breaks():
    @lazy.compile
    def f(x):
        _collector.set([])
        return _scaled(x)

    x = torch.randn(4)
    try:
        torch.testing.assert_close(f(x.to(L)).cpu(), x * 2)
        assert len(_collector.get()) == 1
        assert "leaves the ContextVar 'collector' set" in lazy.explain(f)
    finally:
        _collector.set(None)


class Output(collections.OrderedDict):
    """transformers' ModelOutput in small: an OrderedDict whose Python __setitem__ also sets the attribute, and
    whose __getitem__ takes an index too."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __getitem__(self, k):
        return list(self.values())[k] if isinstance(k, int) else super().__getitem__(k)

    def __delitem__(self, key):
        super().__delitem__(key)
        super().__delattr__(key)


def test_dicts_of_a_subclass_the_call_creates_are_followed():
    """Note [Dicts of a subclass the call creates]: items stored through a Python __setitem__ (and the base class's
    reached through super()) read back, by key, index or attribute, as the values stored."""
    @lazy.compile
    def f(x, scale):
        out = Output()
        out["loss"] = (x * scale).sum()
        out["hidden"] = x + scale
        out["tmp"] = x
        del out["tmp"]
        plain = collections.OrderedDict(a=x)
        plain["b"] = x * 2
        return out.loss + out[1].sum() + out["hidden"].mean() + sum(v.sum() for v in plain.values()), len(out)

    x = torch.randn(5)
    for scale in (1.0, 2.0, 3.0):
        got, n = f(x.to(L), scale)
        want = (x * scale).sum() + (x + scale).sum() + (x + scale).mean() + 3 * x.sum()
        torch.testing.assert_close(got.cpu(), want)
        assert n == 2
    assert counter("capture.captures") == 1 and counter("capture.replays") == 2


def test_a_defaultdict_the_call_creates_stays_opaque():
    """A dict with __missing__ (a read of a missing key stores) is not shadowed: a store into it breaks."""
    @lazy.compile
    def f(x):
        d = collections.defaultdict(list)
        d["a"].append(x)
        d["b"] = x * 2
        return d["a"][0] + d["b"]

    x = torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(f(x.to(L)).cpu(), x * 3)
    assert counter("capture.replays") == 0 and "runs plainly" in lazy.explain(f)


def test_count_and_index_of_a_sequence_from_the_inputs():
    """list/tuple ``count`` and ``index`` answer as Python does (count was answered by index), guarded by the items
    they read: other items capture again."""
    @lazy.compile
    def f(x, items):
        return x * items.count(2) + items.index(5)

    x = torch.randn(3)
    for items in ([1, 2, 2, 5], [1, 2, 2, 5], (2, 2, 2, 5), [5, 2]):
        torch.testing.assert_close(f(x.to(L), items).cpu(), x * items.count(2) + items.index(5))
    assert counter("capture.replays") == 1 and counter("capture.captures") == 3


def test_a_set_the_call_builds_iterates_in_its_own_order():
    """A set the call builds and changes (add, discard) iterates as Python iterates it: in hash order, without the
    discarded elements, each element once."""
    @lazy.compile
    def f(x, a, b, c):
        s = set([a, b])
        s.add(c)
        s.add(a)
        s.discard(b)
        return [x * v for v in s]

    x = torch.randn(2)
    for _ in range(3):
        s = {30, 1}
        s.add(2)
        s.add(30)
        s.discard(1)
        got = f(x.to(L), 30, 1, 2)
        assert len(got) == len(s)
        for g, v in zip(got, s):
            torch.testing.assert_close(g.cpu(), x * v)
    assert counter("capture.replays") == 2


class Order:
    descending = False


def test_sorted_reads_its_reverse_flag_as_state():
    """``sorted(..., reverse=obj.flag)``: the flag is guarded, so flipping it captures again rather than replaying
    the old order."""
    order = Order()

    @lazy.compile
    def f(x, a, b):
        return [x * v for v in sorted([a, b], reverse=order.descending)]

    x = torch.randn(2)
    for descending in (False, False, True):
        order.descending = descending
        got = f(x.to(L), 3.0, 1.0)
        for g, v in zip(got, sorted([3.0, 1.0], reverse=descending)):
            torch.testing.assert_close(g.cpu(), x * v)
    assert counter("capture.captures") == 2 and counter("capture.replays") == 1

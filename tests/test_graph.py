"""lazy/ir/graph.py: linearize's order and key (Note [Graph key])."""
import pytest
import torch

from lazy.ir.graph import linearize
from lazy.trace.views import value

L = "lazy"


def test_key_is_structure_not_data():
    x, y = torch.randn(3, 4).to(L), torch.randn(3, 4).to(L)
    a = linearize([value((x * 2.0 + y).relu())])
    b = linearize([value((y * 5.0 + x).relu())])  # other data, another runtime scalar
    assert a.key == b.key and hash(a.key) == hash(b.key)
    assert a.scalars == [2.0] and b.scalars == [5.0]
    assert [t.data_ptr() for t in a.leaves] != [t.data_ptr() for t in b.leaves]


def test_key_tells_sharing_shapes_dtypes_and_outputs_apart():
    x, y = torch.randn(3, 4).to(L), torch.randn(3, 4).to(L)
    keys = [linearize([value(x + x)]).key, linearize([value(x + y)]).key,
            linearize([value(x.double() + y.double())]).key,
            linearize([value(torch.randn(4, 3).to(L) + y.t())]).key,
            linearize([value(x + y), value(x)]).key]
    assert len(set(keys)) == len(keys)


def test_order_is_topological_and_positions_are_lazy():
    x = torch.randn(4).to(L)
    y = x.sin()
    z = (y + y.cos()).exp()
    lin = linearize([value(z)])
    assert lin._positions is None  # a cache hit never builds the map
    pos = lin.positions
    for i, node in enumerate(lin.order):
        assert pos[id(node)] == i
        assert all(pos[id(inp)] < i for inp in node.inputs)
    assert lin.outputs == [len(lin.order) - 1]


def test_add_outputs_extends_the_key():
    x = torch.randn(4).to(L)
    y = x.sin()
    z = y.exp()
    lin = linearize([value(z)])
    key = lin.key
    lin.add_outputs([lin.positions[id(value(y))]])
    assert lin.outputs == [len(lin.order) - 1, lin.positions[id(value(y))]]
    assert lin.key != key and lin.key.startswith(key)
    assert lin.key == linearize([value(z), value(y)]).key


def test_data_leaves_built_in_c_equal_the_python_definition():
    """``data_leaf`` (csrc/replay_io.cpp) reads sizes and strides from the TensorImpl, and through Python for a
    tensor whose sizes Python answers: the node is the one ``Node(DATA, ...)`` builds, signature included."""
    from torch.testing._internal.two_tensor import TwoTensor

    from lazy.ir.node import DATA, Node, data_leaf

    base = torch.randn(4, 6)
    cases = [base, base.t(), base[1:3, ::2], torch.tensor(2.5), torch.zeros(0, 3, dtype=torch.bool),
             torch.nn.Parameter(torch.randn(3)), torch.empty(2, 3, device="meta"),
             TwoTensor(torch.randn(2, 3), torch.randn(2, 3))]
    for t in cases:
        want = Node(DATA, (tuple(t.stride()),), (), (), (), tuple(t.shape), t.dtype, data=t)
        got = data_leaf(t)
        assert got.is_data and got.data is t and got.sig is want.sig, t
        assert (got.args, got.kwargs, got.inputs, got.scalars, got.shape, got.dtype, got.metas) == \
               (want.args, want.kwargs, want.inputs, want.scalars, want.shape, want.dtype, want.metas)
        assert all(type(d) is int for d in got.shape + got.args[0])
    with pytest.raises(AttributeError):
        data_leaf(3.0)


def test_equal_graphs_share_one_key_object():
    """Note [Interned graph keys]: a graph walked again returns the key object of its last walk (its hash cached),
    and graphs that differ get keys that differ."""
    x, y = torch.randn(3, 4).to(L), torch.randn(3, 4).to(L)
    a = linearize([value((x * 2.0).sin())]).key
    b = linearize([value((y * 3.0).sin())]).key
    c = linearize([value((x * 2.0).cos())]).key
    assert a is b and a == b
    assert c != a and c is not a
    assert bytes(a) == bytes(b)  # a plain bytes object


def test_many_distinct_graphs_keep_their_keys_exact():
    """The interning table starts over past its bounds: every key still encodes its own graph."""
    x = torch.randn(2).to(L)
    keys = {}
    for n in range(1, 4200, 7):  # more distinct graphs than the table holds, once around
        y = x
        for _ in range(n % 61 + 1):
            y = y + 1.0
        keys.setdefault(n % 61, linearize([value(y)]).key)
        assert linearize([value(y)]).key == keys[n % 61]
    assert len(set(keys.values())) == len(keys)


def test_a_long_graph_is_freed_to_its_leaves():
    """Note [Nodes freed without recursion]: dropping a 100,000-node chain frees every node, down to its data
    leaf's tensor, and a graph that shares nodes with a live one frees only its own."""
    import weakref

    x = torch.randn(3).to(L)
    leaf = value(x).data
    alive = weakref.ref(leaf)
    y = x
    for _ in range(100_000):
        y = y + 1.0
    kept = y * 2.0  # shares the chain
    del x, leaf, y
    assert alive() is not None  # the chain lives on in ``kept``
    del kept
    assert alive() is None


def test_a_walk_nested_in_a_finalizer_leaves_the_outer_walk_whole():
    """The lists a walk makes can start a garbage collection whose finalizers sync, and so walk, again: the outer
    walk's order, key, leaves and scalars are those of a walk without one."""
    import gc

    x, y = torch.randn(3, 4).to(L), torch.randn(4).to(L)
    g = ((x * 2.0 + y).relu() * 3.0).sum(0)
    want = linearize([value(g)])
    nested = []

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):  # another graph, walked while the outer walk makes its lists
            nested.append(linearize([value((y * 5.0).exp() - x.sum(1).sum())]))

    threshold = gc.get_threshold()
    gc.collect()
    try:
        for _ in range(50):
            Cycle()
            gc.set_threshold(1)  # every container allocated collects: the walk's lists run the finalizer
            got = linearize([value(g)])
            gc.set_threshold(*threshold)
            assert got.key == want.key and got.outputs == want.outputs and got.scalars == want.scalars
            assert [id(n) for n in got.order] == [id(n) for n in want.order]
            assert [t.data_ptr() for t in got.leaves] == [t.data_ptr() for t in want.leaves]
    finally:
        gc.set_threshold(*threshold)
    assert nested  # the finalizer did walk inside some of them

"""The graph cache: structural keys, runtime scalars, hits and recompiles."""
import importlib.util

import torch

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics

L = "lazy"


def test_changing_scalars_and_data_compile_once():
    for i in range(100):
        s = 0.5 + i * 0.01
        x = torch.randn(8, 8).to(L)
        y = (x * s + 1).relu()
        lazy.mark_step()
        if i % 25 == 0:
            torch.testing.assert_close(y.cpu(), (x.cpu() * s + 1).relu())
    assert metrics.counter("compiles") == 1
    assert metrics.counter("graph_cache.hit") == 99


def test_shape_or_dtype_change_recompiles():
    def step(shape, dtype):
        x = torch.ones(shape, dtype=dtype).to(L)
        y = x * 3 + 1
        lazy.mark_step()
        return y

    step((4, 4), torch.float32)
    step((4, 4), torch.float32)
    assert metrics.counter("compiles") == 1
    step((5, 4), torch.float32)
    assert metrics.counter("compiles") == 2
    y = step((4, 4), torch.float64)
    assert metrics.counter("compiles") == 3
    assert y.dtype == torch.float64 and y.cpu().sum().item() == 64.0


def test_scalar_type_is_part_of_the_key():
    x = torch.arange(4).to(L)
    a = x * 2  # int scalar: stays int64
    lazy.mark_step()
    b = x * 2.5  # float scalar: promotes to float32, a different graph
    lazy.mark_step()
    assert a.dtype == torch.int64 and b.dtype == torch.float32
    assert metrics.counter("compiles") == 2
    torch.testing.assert_close(b.cpu(), torch.arange(4) * 2.5)


def test_leaf_numbering_distinguishes_x_plus_x_from_x_plus_y():
    x = torch.full((3,), 1.0).to(L)
    y = torch.full((3,), 2.0).to(L)
    a = x + x
    assert a.cpu().tolist() == [2.0, 2.0, 2.0]
    b = x + y
    assert b.cpu().tolist() == [3.0, 3.0, 3.0]
    assert metrics.counter("compiles") == 2


def test_shared_and_duplicated_subexpressions_differ():
    x = torch.full((3,), 1.0).to(L)
    a = x + 1
    shared = a * a
    assert shared.cpu().tolist() == [4.0] * 3
    dup = (x + 1) * (x + 2)
    assert dup.cpu().tolist() == [6.0] * 3


def test_lru_eviction():
    graph_cache.clear()
    with lazy.config.override(graph_cache_size=2):
        for n in (1, 2, 3):
            (torch.ones(n, device=L) + 1).cpu()
        assert graph_cache.size() == 2
        assert metrics.counter("graph_cache.evicted") >= 1


def test_dump_dir(tmp_path):
    with lazy.config.override(dump_dir=str(tmp_path)):
        (torch.ones(3, device=L).exp() + 1).sum().item()
    files = list(tmp_path.iterdir())
    assert len(files) == 1
    text = files[0].read_text()
    assert "aten.exp.default" in text and "return" in text


def test_keys_are_exact_even_where_hashes_collide():
    # CPython hashes -1 like -2: keys must compare structure, not hash values.
    assert hash(-1) == hash(-2)
    x = torch.randn(3, 4, 5)
    for dim in (-1, -2, -1, -2):
        torch.testing.assert_close(x.to(L).sum(dim).cpu(), x.sum(dim))
    assert metrics.counter("compiles") == 2


def _run_graph(x):
    y = (x * 1.5).sin().sum(0)
    lazy.mark_step()
    return y.cpu()


def test_auto_compiles_a_graph_at_its_second_execution(tmp_path, cpu_backing):
    """Note [Tiered compilation]: with compiler='auto' on the cpu, the first execution of a graph runs on the
    reference executor, the second compiles it (C++) and later ones run compiled; one graph, one compile."""
    x = torch.randn(5, 3)
    want = (x * 1.5).sin().sum(0)
    with lazy.config.override(compiler="auto", compile_after=2, cache_dir=str(tmp_path)):
        xl = x.to(L)
        lazy.mark_step()
        metrics.reset()
        got = [_run_graph(xl)]
        assert metrics.counter("compiles") == 1 and metrics.counter("kernels_launched") == 0
        assert metrics.counter("cpp.compiles") == 0
        got += [_run_graph(xl), _run_graph(xl)]
        assert metrics.counter("graph_cache.tier_up") == 1 and metrics.counter("cpp.compiles") == 1
        assert metrics.counter("compiles") == 1 and metrics.counter("graph_cache.hit") == 2
        assert metrics.counter("kernels_launched") == 2
    for g in got:
        torch.testing.assert_close(g, want)


def test_compile_after_one_or_an_explicit_compiler_compiles_at_the_first_execution(tmp_path, cpu_backing):
    x = torch.randn(4, 2)
    for settings in ({"compiler": "auto", "compile_after": 1}, {"compiler": "cpp", "compile_after": 3}):
        with lazy.config.override(cache_dir=str(tmp_path), **settings):
            xl = x.to(L)
            lazy.mark_step()
            graph_cache.clear()
            metrics.reset()
            torch.testing.assert_close(_run_graph(xl), (x * 1.5).sin().sum(0))
            assert metrics.counter("kernels_launched") == 1, settings
            assert metrics.counter("graph_cache.tier_up") == 0


def test_compile_after_three_runs_twice_on_the_reference_executor(tmp_path, cpu_backing):
    x = torch.randn(4, 2)
    with lazy.config.override(compiler="auto", compile_after=3, cache_dir=str(tmp_path)):
        xl = x.to(L)
        lazy.mark_step()
        graph_cache.clear()
        metrics.reset()
        launched = []
        for _ in range(4):
            _run_graph(xl)
            launched.append(metrics.counter("kernels_launched"))
        assert launched == [0, 0, 1, 2] and metrics.counter("graph_cache.tier_up") == 1


def test_auto_picks_the_compiler_by_backing_device():
    with lazy.config.override(compiler="auto"):
        assert graph_cache.backend_for(torch.device("cpu")) == "cpp"
        # Triton on cuda, where it is installed (the reference executor otherwise)
        triton = importlib.util.find_spec("triton") is not None
        assert graph_cache.backend_for(torch.device("cuda", 0)) == ("triton" if triton else "reference")
    with lazy.config.override(compiler="reference"):
        assert graph_cache.backend_for(torch.device("cpu")) == "reference"


def test_triton_compile_pool_starts_at_a_large_graph_that_will_tier_up(monkeypatch):
    """Note [Triton compiles]: on cuda the workers start at the first large graph that warms up (a training step's
    first graph), not when a graph tiers up and needs them."""
    from lazy.runtime import triton_build
    from lazy.sync import BEFORE_RUN

    graphs = []
    BEFORE_RUN.append(lambda lin, hit: graphs.append(lin))
    try:
        x = torch.randn(4).to("lazy")
        (x + 1).cpu()
        y = x
        for _ in range(triton_build.PRESTART_NODES):
            y = y * 1.01
        y.cpu()
    finally:
        BEFORE_RUN.pop()
    small, big = graphs
    started = []
    monkeypatch.setattr(triton_build, "start_pool", lambda: started.append(True))
    monkeypatch.setattr(graph_cache, "backend_for", lambda device: "triton")
    monkeypatch.setattr(graph_cache, "_compile", lambda backend, lin, device, key, why: object())
    cuda = torch.device("cuda")
    graph_cache.clear()  # on a cuda backing device the two runs above put both graphs in the cache already
    try:
        with lazy.config.override(compiler="auto", compile_after=2):
            graph_cache.lookup(small, cuda)
            assert not started
            graph_cache.lookup(big, cuda)
            assert started == [True]
        with lazy.config.override(compiler="triton"):  # compiled at the first run, in place: no pool
            graph_cache.clear()
            graph_cache.lookup(big, cuda)
            assert started == [True]
    finally:
        graph_cache.clear()

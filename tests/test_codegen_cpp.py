"""The C++ renderer and runtime: templates, serial/parallel paths, runtime scalars, fallback on failure."""
import warnings

import pytest
import torch

import lazy
from lazy.cache import graph_cache
from lazy.codegen import cpp
from lazy.debug import metrics
from lazy.lower import pointwise


@pytest.fixture(autouse=True, scope="module")
def cpp_backend(tmp_path_factory):
    with lazy.config.override(compiler="cpp", cache_dir=str(tmp_path_factory.mktemp("lazy-cache"))):
        yield


def last_program():
    return next(reversed(graph_cache._CACHE.values()))


def test_every_lowered_expression_op_has_a_template():
    import inspect
    import re
    used = set()
    for mod in (pointwise, __import__("lazy.lower.structure", fromlist=["x"])):
        used |= set(re.findall(r'kir\.op\("(\w+)"', inspect.getsource(mod)))
        used |= set(re.findall(r'_(?:unary|binary|compare|logical)\("(\w+)"', inspect.getsource(mod)))
    missing = {u for u in used if u not in cpp.TEMPLATES}
    assert not missing


def test_parallel_only_when_large_and_scalars_are_arguments():
    small = torch.randn(16, 16).to("lazy")
    (small * 0.123456 + 1).cpu()
    src = last_program().source
    assert "omp parallel" not in src and "0.123456" not in src and "F[0]" in src
    big = torch.randn(512, 512).to("lazy")
    ((big * 2).exp() + big).cpu()
    assert "#pragma omp parallel for" in last_program().source


def test_program_interface():
    x0 = torch.randn(8, 8)
    y = (x0.to("lazy").softmax(1) * 2)
    metrics.reset()
    torch.testing.assert_close(y.cpu(), x0.softmax(1) * 2)
    p = last_program()
    assert p.backend == "cpp" and p.num_kernels == 1 and "extern \"C\"" in p.source
    assert metrics.counter("kernels_compiled") == 1 and metrics.counter("kernels_launched") == 1


def test_compiler_failure_falls_back_with_one_warning():
    x0 = torch.randn(5, 5)
    with lazy.config.override(cxx="/nonexistent/c++", cache_dir=""):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = (x0.to("lazy") * 3.25).tanh().cpu()
    torch.testing.assert_close(y, (x0 * 3.25).tanh())
    msgs = [str(w.message) for w in caught if "cpp backend" in str(w.message)]
    assert len(msgs) == 1 and "/nonexistent/c++" in msgs[0]
    assert metrics.counter("compile_fallback") == 1
    assert last_program().backend == "reference"


def test_compiler_choice_follows_config_at_lookup():
    x = torch.randn(3, 3).to("lazy")
    lazy.mark_step()
    with lazy.config.override(compiler="reference"):
        (x + 1).cpu()
        assert last_program().backend == "reference"
    (x + 1).cpu()
    assert last_program().backend == "cpp"
    assert metrics.counter("graph_cache.miss") == 2


def test_unsupported_dtype_is_extern_not_wrong():
    x0 = torch.randn(4, 4)
    y = (x0.to("lazy").half() * 2).float() + 1
    torch.testing.assert_close(y.cpu(), (x0.half() * 2).float() + 1)
    assert metrics.counter("compile_fallback") == 0
    assert metrics.counter("extern.aten.mul.Tensor") == 1

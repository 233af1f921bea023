"""OpInfo conformance under the Triton compiler: the checks of tests/test_conformance.py (outputs, in-place and
out= variants against eager on the backing device), with every graph compiled by ``compiler="triton"``.

On the cpu backing device the kernels run under Triton's interpreter, which is slow: the default run covers a
representative subset (``DEFAULT_OPS`` in ``DEFAULT_DTYPES``: pointwise families, integer division, comparisons,
casts, where/clamp, each reduction kind, softmax, norms, arg reductions, movement and indexing ops); ``-m slow``
runs the ops of tests/test_conformance_cpp.py's default set in every dtype. ``test_grad_triton`` runs the gradient
and double-backward checks of tests/test_conformance_autograd.py for every differentiable op (about a minute on the
cpu). With LAZY_BACKING_DEVICE=cuda the same cases compare Triton's compiled kernels with eager CUDA.

A graph the renderer cannot express runs on the reference executor (``compile_fallback``): never wrong, but the
default run asserts there is none for its ops.
"""
import warnings

import pytest
import torch

import lazy

import test_conformance as tc
import test_conformance_autograd as tca
import test_conformance_cpp as tcc

pytest.importorskip("triton")

DEFAULT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool)
DEFAULT_OPS = frozenset((
    "add", "mul", "div.no_rounding_mode", "div.floor_rounding", "remainder", "pow", "maximum", "lerp",
    "bitwise_left_shift", "eq", "logical_and", "isnan", "abs", "exp", "sigmoid", "tanh", "sign", "round",
    "nn.functional.gelu", "where", "clamp", "to", "sum", "mean", "prod", "amax", "var", "softmax", "log_softmax",
    "nn.functional.layer_norm", "argmax", "argmin", "max.reduction_with_dim", "permute", "cat", "gather",
    "index_select",
))


def _cases():
    params = []
    for op in tc.op_db:
        name = tc.full_name(op)
        if name not in tcc.DEFAULT_OPS and name not in DEFAULT_OPS:
            continue
        for dtype in tcc.DTYPES:
            if dtype not in op.supported_dtypes("cpu"):
                continue
            default = name in DEFAULT_OPS and dtype in DEFAULT_DTYPES and not tc.ALL_SAMPLES
            params.append(pytest.param(op, dtype, id=f"{name}-{tc.dtype_name(dtype)}",
                                       marks=[] if default else [pytest.mark.slow]))
    return params


RESULTS: dict = {}


@pytest.fixture(autouse=True, scope="module")
def triton_backend(tmp_path_factory):
    with lazy.config.override(compiler="triton", cache_dir=str(tmp_path_factory.mktemp("lazy-cache"))):
        yield


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("op,dtype", _cases())
def test_op_triton(op, dtype, monkeypatch):
    if (tc.full_name(op), dtype) in tcc.PRECISION:
        monkeypatch.setitem(tc.TOLERANCES, dtype, tcc.PRECISION[tc.full_name(op), dtype])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tc._run_case(op, dtype, RESULTS)
    n = lazy.metrics.counter("compile_fallback")
    assert not n or tc.full_name(op) not in DEFAULT_OPS, \
        f"{n} graph(s) fell back to the reference executor: {[str(w.message) for w in caught][:2]}"


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("order", [1, 2], ids=["grad", "gradgrad"])
@pytest.mark.parametrize("op", [pytest.param(op, id=tc.full_name(op)) for op in tca.CASES])
def test_grad_triton(op, order):
    """tests/test_conformance_autograd.py's check of an op's gradients (``gradgrad``: its double backward), every
    graph compiled by Triton: backward graphs are where index checks of masked lanes and constants' NaN tests
    went wrong."""
    if order == 2 and not op.supports_gradgrad:
        pytest.skip("no double backward")
    tca._check(op, order)

"""Known failures of the OpInfo conformance suites (tests/test_conformance.py, tests/test_conformance_autograd.py).

Keys are ``(OpInfo name[.variant], dtype)``; the value says why, starting with its category:
- ``"clear error: ..."``: lazy raises an error that names the problem and the fix (acceptable).
- ``"unclear error: ..."``: lazy raises, but the message does not help the user (a bug to fix).
- ``"skip: ..."``: not run at all (say why).
A wrong result is never a known failure: the test fails on any mismatch, listed here or not.
"""

_SPARSE = "clear error: sparse layouts are not held by the lazy device (UnsupportedLayout says: keep them on the cpu)"
_CPU_INDICES = ("clear error: eager's own check, as on any non-cpu device: tensor_split wants its index tensor on the "
                "cpu (the split sizes decide output shapes)")

_RESIZING_INPLACE = ("clear error: in-place addbmm_ on a self smaller than the result (every-sample run): eager cpu "
                     "resizes self, the meta kernel refuses as for any in-place op (\"output with shape [1] doesn't "
                     "match the broadcast shape [5, 10]\"), as torch.compile does")

_JITERATOR = ("unclear error: torch.cuda.jiterator kernels (in op_db on CUDA builds only) are CUDA source compiled "
              "and launched directly, outside the dispatcher, so lazy never sees the call; CUDA raises "
              "'CUDAGuardImpl initialized with non-CUDA DeviceType: lazy'. Fix: run them on cuda tensors")

KNOWN_FAILURES: dict = {
    ("addbmm", "float32"): _RESIZING_INPLACE,
    ("addbmm", "int64"): _RESIZING_INPLACE,
    ("sparse.sampled_addmm", "float32"): _SPARSE,
    ("sparse.mm.reduce", "float32"): _SPARSE,
    ("to_sparse", "float32"): _SPARSE,
    ("to_sparse", "int64"): _SPARSE,
    ("tensor_split", "float32"): _CPU_INDICES,
    ("tensor_split", "int64"): _CPU_INDICES,
    **{(f"jiterator_{name}", dtype): _JITERATOR for dtype in ("float32", "int64") for name in (
        "unary", "binary", "4inputs_with_extra_args", "binary_return_by_ref", "2inputs_2outputs")},
    # tests/test_conformance_autograd.py: gradients of the first float32 sample, keyed name + ".grad"
    # (".gradgrad" for double backward).
    ("sparse.sampled_addmm.grad", "float32"): _SPARSE,
    ("sparse.mm.reduce.grad", "float32"): _SPARSE,
    ("to_sparse.grad", "float32"): _SPARSE,
    ("tensor_split.grad", "float32"): _CPU_INDICES,
    ("sparse.sampled_addmm.gradgrad", "float32"): _SPARSE,
    ("sparse.mm.reduce.gradgrad", "float32"): _SPARSE,
    ("to_sparse.gradgrad", "float32"): _SPARSE,
    ("tensor_split.gradgrad", "float32"): _CPU_INDICES,
}
# The same errors in every dtype (tests/test_conformance_cpp.py runs more dtypes than float32 and int64).
for _dtype in ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"):
    for _name, _why in (("sparse.sampled_addmm", _SPARSE), ("sparse.mm.reduce", _SPARSE), ("to_sparse", _SPARSE),
                        ("tensor_split", _CPU_INDICES)):
        KNOWN_FAILURES.setdefault((_name, _dtype), _why)

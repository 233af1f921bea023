"""torch._lazy (LazyTensorCore's Python API) acts on this runtime after ``import lazy`` (lazy/compat.py)."""
import subprocess
import sys

import pytest
import torch

import lazy


def test_mark_step_wait_and_sync_multi_act_on_lazy():
    x = torch.randn(3, 4).to("lazy")
    y = x * 2 + 1
    torch._lazy.mark_step(device="", wait=False)
    assert lazy.metrics.counter("mark_step") == 1 and y._lz_st.value.is_data
    torch._lazy.wait_device_ops()
    z = y.relu()
    torch._lazy.sync_multi([z], devices=["lazy"])
    assert lazy.metrics.counter("sync.sync_multi") == 1 and z._lz_st.value.is_data
    torch.testing.assert_close(torch._lazy.to_cpu([z])[0], (x.cpu() * 2 + 1).relu())
    torch._lazy.mark_step(wait=True)


def test_metrics_are_lazys_counters():
    torch._lazy.metrics.reset()
    assert torch._lazy.metrics.counter_names() == []
    (torch.ones(2).to("lazy") + 1).cpu()
    names = torch._lazy.metrics.counter_names()
    assert "sync.cpu" in names and names == list(lazy.metrics.counters())
    assert torch._lazy.metrics.counter_value("sync.cpu") == lazy.metrics.counter("sync.cpu") == 1
    assert torch._lazy.metrics.counter_value("never.bumped") is None
    assert torch._lazy.metrics.metrics_report() == lazy.metrics.report()


def test_ts_backend_init_leaves_lazy_in_place():
    import torch._lazy.ts_backend
    torch._lazy.ts_backend.init()
    x = torch.arange(4.0, device="lazy") * 3
    assert lazy.is_lazy(x)
    torch.testing.assert_close(x.cpu(), torch.arange(4.0) * 3)


def test_step_closures_run_at_mark_step():
    seen = []
    x = torch.ones(2).to("lazy") * 5
    torch._lazy.add_step_closure(lambda t: seen.append(t.cpu().tolist()), args=(x,))
    assert seen == []
    torch._lazy.mark_step()
    assert seen == [[5.0, 5.0]]


def test_save_and_dump_ir(tmp_path):
    x = torch.ones(2).to("lazy")
    y = x.sin()
    assert "aten.sin.default" in torch._lazy.debug.dump_ir([y], "text")
    torch._lazy.save([y], tmp_path / "t.pt")
    torch.testing.assert_close(torch.load(tmp_path / "t.pt")[0], torch.ones(2).sin())


@pytest.mark.parametrize("call", [
    lambda: torch._lazy.get_tensor_id(torch.ones(1, device="lazy")),
    lambda: torch._lazy.debug.render_ir_graph([torch.ones(1, device="lazy")]),
    lambda: torch._lazy.debug.dump_ir([torch.ones(1, device="lazy")], "backend"),
    lambda: torch._lazy.config.set_force_fallback("aten::add"),
    lambda: torch._lazy.ir_cache.dump("/dev/null"),
])
def test_ltc_machinery_raises_a_clear_error(call):
    with pytest.raises(NotImplementedError, match="LazyTensorCore's own machinery.*lazy"):
        call()


def test_pytorchs_own_wrapper_set_seed_runs_on_lazy():
    """op_db's random OpInfos call torch._lazy.mark_step() from wrapper_set_seed: the same seed, the same values."""
    from torch.testing._utils import wrapper_set_seed
    x = torch.ones(64, device="lazy")
    a = wrapper_set_seed(torch.nn.functional.dropout, x, 0.5)
    b = wrapper_set_seed(torch.nn.functional.dropout, x, 0.5)
    assert a._lz_st.value.is_data  # mark_step ran inside the wrapper
    assert torch.equal(a.cpu(), b.cpu()) and set(a.cpu().unique().tolist()) <= {0.0, 2.0}


def test_works_whatever_the_import_order():
    code = ("import torch._lazy, torch._lazy.metrics\n"
            "import lazy\n"
            "from torch._lazy import mark_step\n"
            "x = torch.ones(3, device='lazy') * 2\n"
            "mark_step()\n"
            "print(torch._lazy.metrics.counter_value('mark_step'), x.cpu().tolist())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "[2.0,", "2.0,", "2.0]"]
    code = "import lazy, torch\ntorch._lazy.mark_step()\nprint('ok')\n"  # torch._lazy never imported by the user
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "ok\n"

"""Modules on the lazy device: parameter identity, weight tying, buffers, state dicts, save and load."""
import io
import subprocess
import sys

import torch
import torch.nn as nn


L = "lazy"


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.norm = nn.LayerNorm(6)
        self.bn = nn.BatchNorm1d(6)
        self.lm_head = nn.Linear(6, 11, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, idx):
        h = self.norm(self.embed(idx))
        return self.lm_head(h)


def test_to_lazy_keeps_identity_and_tying():
    torch.manual_seed(0)
    m = Tied()
    params = {name: p for name, p in m.named_parameters()}
    m.to(L)
    assert m.lm_head.weight is m.embed.weight
    for name, p in m.named_parameters():
        assert p is params[name]
        assert isinstance(p, nn.Parameter) and p.device.type == "lazy" and p.requires_grad
    assert len(list(m.parameters())) == len(params)
    assert m.bn.running_mean.device.type == "lazy" and m.bn.num_batches_tracked.device.type == "lazy"


def test_forward_matches_eager_and_back_to_cpu():
    torch.manual_seed(0)
    m = Tied().eval()
    idx = torch.randint(0, 11, (2, 5))
    # NOTE: no_grad: an output's autograd graph holds the parameters, and Module.to swaps parameters in place
    # (that is what keeps identity and tying), which needs them unreferenced, as for any tensor subclass.
    with torch.no_grad():
        want = m(idx)
        m.to(L)
        got = m(idx.to(L))
    torch.testing.assert_close(got.cpu(), want)
    m.to("cpu")  # NOTE: like eager's cuda -> cpu, this direction makes new Parameters unless the swap flag is set
    assert m.embed.weight.device.type == "cpu" and type(m.embed.weight) is nn.Parameter
    torch.testing.assert_close(m(idx), want)


def test_state_dict_roundtrip_between_cpu_and_lazy():
    torch.manual_seed(0)
    src = Tied()
    dst = Tied().to(L)
    dst.load_state_dict(src.state_dict())
    for (k, v), (k2, v2) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert k == k2 and v2.device.type == "lazy"
        torch.testing.assert_close(v2.cpu(), v)
    back = Tied()
    back.load_state_dict({k: v.cpu() for k, v in dst.state_dict().items()})
    torch.testing.assert_close(back.embed.weight, src.embed.weight)


def test_torch_save_stores_plain_cpu_tensors(tmp_path):
    torch.manual_seed(0)
    m = Tied().to(L)
    path = tmp_path / "model.pt"
    torch.save(m.state_dict(), path)
    t = torch.arange(5.0).to(L) * 2
    torch.save({"t": t}, tmp_path / "t.pt")
    code = (
        "import torch, sys\n"
        f"sd = torch.load({str(path)!r})\n"
        f"t = torch.load({str(tmp_path / 't.pt')!r})['t']\n"
        "assert 'lazy' not in sys.modules\n"
        "assert all(v.device.type == 'cpu' and type(v) is torch.Tensor for v in sd.values())\n"
        "print(t.tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[0.0, 2.0, 4.0, 6.0, 8.0]"
    loaded = torch.load(path)
    fresh = Tied()
    fresh.load_state_dict(loaded)
    torch.testing.assert_close(fresh.embed.weight, m.embed.weight.cpu())


def test_save_load_in_memory_roundtrip():
    buf = io.BytesIO()
    torch.save([torch.ones(2, device=L), torch.zeros(3, dtype=torch.int64, device=L)], buf)
    buf.seek(0)
    a, b = torch.load(buf)
    assert a.tolist() == [1.0, 1.0] and b.dtype == torch.int64


def test_module_dtype_conversion_on_lazy():
    m = nn.Linear(3, 2).to(L)
    w = m.weight
    m.double()
    assert m.weight is w and m.weight.dtype == torch.float64 and m.weight.device.type == "lazy"
    out = m(torch.ones(1, 3, dtype=torch.float64).to(L))
    assert out.cpu().dtype == torch.float64


def test_deepcopy_of_a_lazy_model():
    import copy
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5, bias=False))
    model[1].weight = model[0].weight  # tied
    lz = model.to(L)
    lz(torch.tensor([1, 2]).to(L)).sum().backward()
    twin = copy.deepcopy(lz)
    w, w2 = lz[0].weight, twin[0].weight
    assert isinstance(w2, torch.nn.Parameter) and w2.requires_grad and twin[1].weight is w2
    torch.testing.assert_close(w2.cpu(), w.cpu())
    torch.testing.assert_close(w2.grad.cpu(), w.grad.cpu())
    with torch.no_grad():
        w2.add_(1)  # independent storage
    torch.testing.assert_close(w2.cpu(), w.cpu() + 1)

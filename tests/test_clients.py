"""Real client code runs unchanged on lazy: Hugging Face ``transformers`` models, where the package is installed.

Optional: the suite does not depend on ``transformers``; these tests skip without it. Each builds a model from a small
config (no download), trains it a few steps with AdamW on eager and on lazy from the same initial weights and
batches, and compares losses and parameters; then generates greedily on both.
"""
import pytest
import torch

import lazy

transformers = pytest.importorskip("transformers")

EAGER = str(lazy.sync.backing_device())
STEPS, LR = 4, 1e-3


def _gpt2(device):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=1)
    return transformers.GPT2LMHeadModel(config).to(device)


def _train(model, device):
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(step)).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device == "lazy":
            lazy.mark_step()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _assert_trained_alike(got_losses, got_state, want_losses, want_state, d):
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-4, atol=1e-5)
    for name, want in want_state.items():
        got = got_state[name].clone()
        if d is not None and name.endswith("attn.c_attn.bias"):
            # The key part of the qkv bias gets a gradient that is rounding noise (q.b_k is constant along each
            # softmax row), which AdamW turns into steps of up to lr: compiled kernels round differently from eager.
            torch.testing.assert_close(got[d:2 * d], want[d:2 * d], rtol=0, atol=LR * len(got_losses), msg=name)
            got[d:2 * d] = want[d:2 * d]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


def test_gpt2_lm_head_model_trains_and_generates_as_eager():
    """The client of the seeded-op fix: GPT-2's attention records SDPA's CPU kernel with ``dropout_p`` positionally,
    ``scale`` by keyword and a seed."""
    if EAGER != "cpu":
        pytest.xfail("on cuda, eager picks fused attention kernels that lazy does not mirror yet; AdamW amplifies "
                     "their rounding differences")
    want_losses, want_state = _train(_gpt2(EAGER), EAGER)
    model = _gpt2("lazy")
    assert model.lm_head.weight is model.transformer.wte.weight  # tied, as in eager
    got_losses, got_state = _train(model, "lazy")
    _assert_trained_alike(got_losses, got_state, want_losses, want_state, model.config.n_embd)

    prompt = torch.tensor([[5, 9, 2, 7]])
    eager_model = _gpt2(EAGER).eval()
    lazy_model = _gpt2("lazy").eval()
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    want = eager_model.generate(prompt.to(EAGER), **kwargs).cpu()
    got = lazy_model.generate(prompt.to("lazy"), **kwargs).cpu()
    assert torch.equal(got, want)


def _bert(device):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, num_labels=3)
    return transformers.BertForSequenceClassification(config).to(device)


def _llama(device):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config).to(device)


def _gpt_neox(device):
    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=32)
    return transformers.GPTNeoXForCausalLM(config).to(device)


def _lm(ids):
    return dict(input_ids=ids, labels=ids)


# model, the inputs of a training step from a batch of token ids, the width whose qkv bias is rounding noise
CAPTURED = {"gpt2": (_gpt2, _lm, 32), "llama": (_llama, _lm, None), "gpt_neox": (_gpt_neox, _lm, None),
            "bert": (_bert, lambda ids: dict(input_ids=ids, labels=ids[:, 0] % 3), None)}


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_training_step_under_lazy_compile_replays_as_eager(name):
    """A whole training step of a transformers model under ``@lazy.compile`` is captured once and replayed (GPT-2:
    its output collector ContextVar, ModelOutput dicts and shape slices; BERT: inspect.signature of a module's
    method, in apply_chunking_to_forward), each replay checked against a plain run (LAZY_CAPTURE_VERIFY), losses and
    parameters equal to eager's."""
    if EAGER != "cpu":
        pytest.xfail("on cuda, eager picks fused attention kernels that lazy does not mirror yet")
    build, inputs, width = CAPTURED[name]

    def train(device, compiled):
        model = build(device)
        opt = torch.optim.AdamW(model.parameters(), lr=LR)

        def step(ids):
            loss = model(**inputs(ids)).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()

        if compiled:
            step = lazy.compile(step)
        losses = [step(torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(s)).to(device)).item()
                  for s in range(6)]
        return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}, step

    want_losses, want_state, _ = train(EAGER, False)
    with lazy.config.override(capture_verify=True):
        got_losses, got_state, step = train("lazy", True)
    assert lazy.metrics.counter("capture.replays") >= 4, lazy.explain(step)
    _assert_trained_alike(got_losses, got_state, want_losses, want_state, width)
    lazy.compile.reset()

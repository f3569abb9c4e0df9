"""Hugging Face transformers models on `tpu`, compared with the same model on CPU.

Tiny random-weight configurations built in code (no hub downloads): each
model is copied, one copy runs forward and backward on the CPU, the other is
moved with `model.to("tpu")` and runs the same batch. The move must keep every
Parameter object (GPT-2's `lm_head.weight` stays `transformer.wte.weight`),
and the loss, the logits and every parameter's gradient must match the CPU's.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB = 64


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2,
                                  n_head=4)
    return transformers.GPT2LMHeadModel(cfg)


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(cfg)


def _qwen2():
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=32)
    return transformers.Qwen2ForCausalLM(cfg)


def _bert():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=32)
    return transformers.BertForMaskedLM(cfg)


MODELS = {"gpt2": _gpt2, "llama": _llama, "qwen2": _qwen2, "bert": _bert}


def _tied_names(model):
    """Pairs of parameter names that are one Parameter object."""
    seen, pairs = {}, []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            pairs.append((seen[id(p)], name))
        else:
            seen[id(p)] = name
    return pairs


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_backward_matches_cpu(name):
    torch.manual_seed(0)
    model = MODELS[name]().eval()  # eval: no dropout, so both runs compute the same thing
    ref = copy.deepcopy(model)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # one padded row exercises the attention mask

    ref_out = ref(input_ids=ids, attention_mask=mask, labels=ids)
    ref_out.loss.backward()

    before = dict(model.named_parameters())
    tied = _tied_names(model)
    assert model.to("tpu") is model
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    for n, p in after.items():
        assert p is before[n], f"{name}: .to('tpu') replaced parameter {n}"
        assert p.device.type == "tpu", n
    # Weights tied before the move stay one object (GPT-2's wte and lm_head).
    assert _tied_names(model) == tied
    if name == "gpt2":
        assert model.lm_head.weight is model.transformer.wte.weight
        assert tied

    out = model(input_ids=ids.to("tpu"), attention_mask=mask.to("tpu"), labels=ids.to("tpu"))
    out.loss.backward()

    torch.testing.assert_close(out.loss.cpu(), ref_out.loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.logits.cpu(), ref_out.logits, rtol=1e-4, atol=1e-5)
    ref_params = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        rp = ref_params[n]
        if rp.grad is None:
            assert p.grad is None, n
            continue
        assert p.grad is not None and p.grad.device.type == "tpu", n
        torch.testing.assert_close(p.grad.cpu(), rp.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, n=n: f"{name} grad of {n}: {m}")


def test_gpt2_optimizer_made_before_the_move_trains_like_cpu():
    """A training script's order: model, optimizer, then `.to(device)`."""
    torch.manual_seed(0)
    model = _gpt2()
    ref = copy.deepcopy(model)
    # SGD with momentum and weight decay: state kept per parameter, updates
    # linear in the gradients (Adam's g / sqrt(v) turns 1e-8 gradient noise
    # into lr-sized steps, which would test rounding, not the move).
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    model.to("tpu")
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(2))
    model.eval(), ref.eval()
    for _ in range(3):
        for m, o, x in ((ref, ref_opt, ids), (model, opt, ids.to("tpu"))):
            o.zero_grad()
            m(input_ids=x, labels=x).loss.backward()
            o.step()
    ref_params = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        assert p.device.type == "tpu", n
        torch.testing.assert_close(p.detach().cpu(), ref_params[n].detach(), rtol=1e-4,
                                   atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
    assert model.lm_head.weight is model.transformer.wte.weight

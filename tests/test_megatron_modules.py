"""The fused local modules compute what megatron-core's stock ones compute."""
import contextlib
import types

import pytest
import torch



def _config(**kw):
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = dict(num_layers=2, hidden_size=64, num_attention_heads=8, num_query_groups=2, ffn_hidden_size=128,
                normalization="RMSNorm", attention_dropout=0.0, hidden_dropout=0.0)
    base.update(kw)
    return TransformerConfig(**base)


def _tp1():
    return types.SimpleNamespace(tp=types.SimpleNamespace(size=lambda: 1))


@pytest.mark.parametrize("groups", [8, 2, 1], ids=["mha", "gqa", "mqa"])
def test_sdpa_core_matches_megatron_dot_product_attention(groups, monkeypatch):
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from primus.backends.megatron.spec import SDPAttention

    # the stock module borrows its score buffer from megatron's (CUDA) global memory buffer and forks the CUDA RNG
    # tracker around dropout: stand-ins for this test only (the CPU redirections are not installed here)
    import megatron.core.transformer.dot_product_attention as dpa

    buffer = types.SimpleNamespace(get_tensor=lambda shape, dtype, name: torch.empty(shape, dtype=dtype))
    monkeypatch.setattr(dpa.parallel_state, "get_global_memory_buffer", lambda: buffer)
    tracker = types.SimpleNamespace(fork=contextlib.nullcontext)
    monkeypatch.setattr(dpa.tensor_parallel, "get_cuda_rng_tracker", lambda: tracker)
    cfg = _config(num_query_groups=groups)
    kw = dict(config=cfg, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self",
              pg_collection=_tp1())
    ours, stock = SDPAttention(**kw), DotProductAttention(**kw)
    s, b, hd = 16, 3, cfg.kv_channels
    g = torch.Generator().manual_seed(0)
    q = torch.randn(s, b, 8, hd, generator=g, requires_grad=True)
    k = torch.randn(s, b, groups, hd, generator=g, requires_grad=True)
    v = torch.randn(s, b, groups, hd, generator=g, requires_grad=True)
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]  # True = masked (megatron)
    out_ours = ours(q, k, v, None)
    out_stock = stock(q, k, v, causal)
    assert out_ours.shape == out_stock.shape == (s, b, 8 * hd)
    torch.testing.assert_close(out_ours, out_stock, atol=1e-5, rtol=1e-4)
    grads_ours = torch.autograd.grad(out_ours.square().sum(), (q, k, v))
    grads_stock = torch.autograd.grad(out_stock.square().sum(), (q, k, v))
    for a, c in zip(grads_ours, grads_stock):
        torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)


class _CpuTorch:
    """megatron's masks and its learned softmax offset are created on device="cuda": the same factories on CPU."""

    def __getattr__(self, name):
        return getattr(torch, name)

    def ones(self, *a, device=None, **kw):
        return torch.ones(*a, **kw)

    def empty(self, *a, device=None, **kw):
        return torch.empty(*a, **kw)


@pytest.mark.parametrize("window,layer", [(None, 1), ((3, 0), 1), ((3, 0), 2), ((2, 1), 3)],
                         ids=["sinks", "sinks+window", "window-skipped-layer", "window-both-sides"])
def test_sink_attention_matches_megatron_dot_product_attention(window, layer, monkeypatch):
    """Learned sinks (softmax_type=learnable) and their sliding window (window_size, window_attn_skip_freq=2: layer
    2 attends in full): the SDPA core with the sink as one more key computes megatron-core's softmax with offset,
    forward and backward, the sinks' own gradient included."""
    import megatron.core.transformer.dot_product_attention as dpa
    import megatron.core.transformer.utils as mutils
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from primus.backends.megatron.spec import SDPAttention

    buffer = types.SimpleNamespace(get_tensor=lambda shape, dtype, name: torch.empty(shape, dtype=dtype))
    monkeypatch.setattr(dpa.parallel_state, "get_global_memory_buffer", lambda: buffer)
    monkeypatch.setattr(dpa.tensor_parallel, "get_cuda_rng_tracker",
                        lambda: types.SimpleNamespace(fork=contextlib.nullcontext))
    monkeypatch.setattr(dpa, "torch", _CpuTorch())
    monkeypatch.setattr(mutils, "torch", _CpuTorch())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    cfg = _config(softmax_type="learnable", window_size=window, window_attn_skip_freq=2)
    kw = dict(config=cfg, layer_number=layer, attn_mask_type=AttnMaskType.causal, attention_type="self",
              pg_collection=_tp1())
    ours, stock = SDPAttention(**kw), DotProductAttention(**kw)
    assert ours.window == (window if layer % 2 else None)
    with torch.no_grad():
        stock.softmax_offset.copy_(torch.linspace(-2.0, 3.0, 8))
        ours.softmax_offset.copy_(stock.softmax_offset)
    s, b, hd = 12, 2, cfg.kv_channels
    g = torch.Generator().manual_seed(1)
    q = torch.randn(s, b, 8, hd, generator=g, requires_grad=True)
    k = torch.randn(s, b, 2, hd, generator=g, requires_grad=True)
    v = torch.randn(s, b, 2, hd, generator=g, requires_grad=True)
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
    out_ours, out_stock = ours(q, k, v, None), stock(q, k, v, causal)
    torch.testing.assert_close(out_ours, out_stock, atol=1e-5, rtol=1e-4)
    plain = SDPAttention(**{**kw, "config": _config()})(q, k, v, None)
    assert (out_ours - plain).abs().max() > 1e-2  # the sinks (and window) change the output
    grads_ours = torch.autograd.grad(out_ours.square().sum(), (q, k, v, ours.softmax_offset))
    grads_stock = torch.autograd.grad(out_stock.square().sum(), (q, k, v, stock.softmax_offset))
    for a, c in zip(grads_ours, grads_stock):
        torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)


def test_sink_attention_in_bf16_keeps_the_sink_to_16_bits():
    """A bf16 run carries the sink's logit in two bf16 channels (its high and low half). With q = 0 and v = 1 the
    output is (i + 1) / (e^sink + i + 1), exact in float64. Here it is within 0.5% of that (0.2%); one bf16 channel
    (the sinks / scale, 101.28 and 90.65, rounded to 101.0 and 90.5) is 3.1% and 2.1% off."""
    import math

    from primus.backends.attention_sinks import sink_attention

    s, d = 6, 64
    q = torch.zeros(1, 2, s, d, dtype=torch.bfloat16)
    k = torch.randn(1, 2, s, d, generator=torch.Generator().manual_seed(2)).bfloat16()
    v = torch.ones(1, 2, s, d, dtype=torch.bfloat16)
    offset = torch.tensor([12.66, 11.3312])  # neither is a bf16 number, nor their quotients by the scale
    out = sink_attention(q, k, v, offset, 1 / math.sqrt(d), True)
    n = torch.arange(1, s + 1, dtype=torch.float64).view(1, 1, s, 1)
    want = n / (offset.double().exp().view(1, 2, 1, 1) + n)
    rel = ((out.double() - want) / want).abs().max()
    assert rel < 5e-3, rel


def test_rmsnorm_matches_torch_and_carries_the_sequence_parallel_mark():
    from primus.backends.megatron.spec import RMSNorm

    cfg = _config()
    norm = RMSNorm(cfg, 64, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    ref = torch.nn.RMSNorm(64, eps=1e-6)
    ref.weight.data.copy_(norm.weight)
    x = torch.randn(5, 2, 64)
    torch.testing.assert_close(norm(x), ref(x))
    assert norm.weight.sequence_parallel is False
    cfg_sp = _config(tensor_model_parallel_size=2, sequence_parallel=True)
    assert RMSNorm(cfg_sp, 64).weight.sequence_parallel is True


def test_local_spec_swaps_in_the_fused_modules():
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec  # noqa: F401 - import order

    from primus.backends.megatron import spec

    cfg = _config(num_moe_experts=4, moe_layer_freq=[0, 1], moe_ffn_hidden_size=32)
    block = spec.decoder_block_spec(cfg, use_te=False, pp_rank=0)
    assert block.layer_norm is spec.RMSNorm
    for layer in block.layer_specs:
        sub = layer.submodules
        assert sub.input_layernorm is spec.RMSNorm and sub.pre_mlp_layernorm is spec.RMSNorm
        assert sub.self_attention.submodules.core_attention is spec.SDPAttention


@pytest.mark.parametrize("trans_b", [False, True])
def test_grouped_gemm_matches_per_expert_matmuls(trans_b):
    from primus.backends.megatron.patches.grouped_gemm import gmm

    g = torch.Generator().manual_seed(1)
    sizes = torch.tensor([3, 0, 5, 2])
    a = torch.randn(10, 16, generator=g, requires_grad=True)
    b = torch.randn(4, 24, 16, generator=g) if trans_b else torch.randn(4, 16, 24, generator=g)
    b.requires_grad_(True)
    out = gmm(a, b, sizes, trans_b=trans_b)
    bb = b.transpose(-1, -2) if trans_b else b
    ref = torch.cat([a[0:3] @ bb[0], a[3:8] @ bb[2], a[8:10] @ bb[3]])
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    assert b.grad[1].abs().sum() == 0 and b.grad[0].abs().sum() > 0  # an expert without tokens gets no gradient


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_process_group_is_bound_to_the_ranks_gpu(device, monkeypatch):
    """On a GPU the default group names this rank's device, as Megatron-LM's initializer does (NCCL then neither
    guesses the device at a collective nor bootstraps each subgroup anew); gloo on CPU takes none."""
    from primus.backends.megatron import trainer
    from primus.context import RunContext

    got = {}
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kw: got.update(kw))
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: got.update(set_device=i))
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "8", "RANK": "5"}.items():
        monkeypatch.setenv(k, v)
    ctx = RunContext(device=device, world_size=8, rank=5, local_rank=1,
                     dist_backend="nccl" if device == "cuda" else "gloo")
    trainer._init_distributed(ctx)
    assert (got["world_size"], got["rank"], got["backend"]) == (8, 5, ctx.dist_backend)
    if device == "cuda":
        assert got["device_id"] == torch.device("cuda", 1) and got["set_device"] == 1
    else:
        assert "device_id" not in got and "set_device" not in got

"""Weight-only int8/int4 linear layers (``models/quantize.py``) keep assisted output equal to plain output: a
row's product has the same bits alone as in a batch, one verify pass gives each token the logits of a plain
step bit for bit, and greedy assisted decoding equals plain decoding token for token on a small random Llama
(both on its own quantized drafter and on prompt lookup, constant and random lookahead schedules)."""

import pytest
import torch
from toy_models import make_causal, sources

from pipelines.engine import (
    AssistedDecoder,
    DecodeOptions,
    PolicyOptions,
    as_decoder,
    model_drafter,
    prompt_lookup,
    rules_from_generation_config,
)
from pipelines.models.quantize import (
    DENSE_ROWS,
    QuantizeOptions,
    WeightOnlyLinear,
    int4_layout,
    quantize_model,
    quantized,
)

CASES = [("int8", 32), ("int4", 32)]  # the toy model's 32 hidden features: int4 groups of 32


def _quantized_llama(dtype: str, group: int, layers: int = 2, seed: int = 0, compute=torch.bfloat16,
                     dense_rows: int | None = None):
    model = make_causal("llama", layers=layers, seed=seed).to(compute)
    replaced = quantize_model(model, dtype, group, dense_rows=dense_rows)
    assert replaced == 7 * layers and quantized(model) == QuantizeOptions(dtype, group, dense_rows=dense_rows)
    assert isinstance(model.lm_head, torch.nn.Linear)  # the head stays in the compute dtype
    return model


@pytest.mark.parametrize("dtype,group", CASES + [("int4", 64), ("int4", 128)])
@pytest.mark.parametrize("compute", [torch.bfloat16, torch.float32])
def test_a_rows_bits_do_not_depend_on_its_batch(dtype, group, compute):
    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 96, bias=True).to(compute)
    layer = WeightOnlyLinear(linear, QuantizeOptions(dtype, group))
    x = torch.randn(8, 128).to(compute)
    alone = torch.stack([layer(x[r : r + 1])[0] for r in range(8)])
    for rows in range(1, 9):
        assert torch.equal(layer(x[:rows]), alone[:rows]), rows
    # and it computes the linear layer, to the rounding of its weights
    close = torch.nn.functional.cosine_similarity(layer(x).float(), linear(x).float(), dim=-1)
    assert close.min() > (0.999 if dtype == "int8" else 0.99), close.min()


@pytest.mark.parametrize("dtype,group", CASES + [("int4", 64)])
@pytest.mark.parametrize("compute", [torch.bfloat16, torch.float32])
def test_the_dense_weights_are_the_kernels_weights(dtype, group, compute):
    torch.manual_seed(1)
    linear = torch.nn.Linear(128, 80, bias=True).to(compute)  # 80 outputs: int4 blocks of 64 or 32 and a short one
    layer = WeightOnlyLinear(linear, QuantizeOptions(dtype, group))
    assert int4_layout() is not None  # this torch's int4 packing is one the dense path reads
    layer.bias = None
    kernel = layer(torch.eye(128, dtype=compute)).t()  # (N, K): the kernel's own weights, a row of the identity each
    dense = layer.dense_weight()
    assert torch.equal(dense if dtype == "int8" else dense.t(), kernel)


@pytest.mark.parametrize("dtype,group", CASES)
def test_a_product_of_many_rows_runs_on_the_dense_weights(dtype, group):
    torch.manual_seed(2)
    linear = torch.nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    layer = WeightOnlyLinear(linear, QuantizeOptions(dtype, group, dense_rows=8))
    w = layer.dense_weight()
    x = torch.randn(8, 64).to(torch.bfloat16)
    expected = torch.nn.functional.linear(x, w) if dtype == "int8" else x @ w
    assert torch.equal(layer(x), expected)
    assert torch.equal(layer(x[:7]), torch.stack([layer(x[r : r + 1])[0] for r in range(7)]))  # the kernel below
    assert QuantizeOptions(dtype).dense_from == DENSE_ROWS[dtype] and QuantizeOptions(dtype, dense_rows=0).dense_from == 0


@pytest.mark.parametrize("dtype,group", CASES)
@pytest.mark.parametrize("dense_rows", [None, 8])  # 8: the 8-token prompt pass runs on the dense weights
def test_one_verify_pass_gives_the_logits_of_plain_steps_bit_for_bit(dtype, group, dense_rows):
    model = _quantized_llama(dtype, group, dense_rows=dense_rows)
    dec = as_decoder(model)
    prompt = sources(1, seed=7, lengths=(9,))[0][0].tolist()
    drafts = [5, 17, 30, 11, 8, 40]  # six drafts: the last prompt token and them take two passes of width 4
    for k in (1, 3, 6):
        verify, plain = verify_pass_and_plain_steps(dec, prompt, drafts[:k], pad=1)
        assert torch.equal(verify, plain), (dtype, k)


def verify_pass_and_plain_steps(dec, prompt: list[int], drafts: list[int], pad: int, capacity: int = 64):
    """The logits (k + 1, V) of the last prompt token and ``drafts`` (k) from one verify pass of a fixed-shape
    decoder, and from plain steps (the prompt, then one token a step); both after the same prompt pass."""
    cache = dec.new_cache(1, capacity)
    verify, _ = dec.forward([prompt + drafts], cache, None, pad_id=pad, need_from=[len(prompt) - 1])
    verify = verify[0, len(prompt) - 1 :].clone()
    cache = dec.new_cache(1, capacity)
    steps, real = dec.forward([prompt], cache, None, pad_id=pad, need_from=[len(prompt) - 1])
    plain = [steps[0, -1].clone()]
    cache.commit(real)
    for token in drafts:
        step, real = dec.forward([[token]], cache, None, pad_id=pad)
        plain.append(step[0, 0].clone())
        cache.commit(real)
    return verify, torch.stack(plain)


@pytest.mark.parametrize("dtype,group", CASES)
def test_greedy_assisted_equals_plain_token_for_token(dtype, group):
    main = _quantized_llama(dtype, group)
    helper = _quantized_llama(dtype, group, layers=1, seed=5)
    ids, mask = sources(5, seed=3)
    prompts = [ids[b, : int(mask[b].sum())].tolist() for b in range(5)]
    max_new = 24
    rules = rules_from_generation_config(main.generation_config, len(prompts[0]), max_new)
    pad = main.config.pad_token_id
    decoder = as_decoder(main)
    plain = AssistedDecoder(decoder, None, pad_id=pad)
    policies = (PolicyOptions("constant", 3), PolicyOptions("constant", 6), PolicyOptions("random", 8, seed=7))
    for batch in (1, 5):
        expected = []
        for s in range(0, 5, batch):
            r = plain.generate(prompts[s : s + batch], rules, DecodeOptions(max_new_tokens=max_new))
            expected += [list(t) for t in r.tokens]
        assert sum(len(t) for t in expected) > 5 * max_new // 2  # most rows run long
        for drafter in (model_drafter(as_decoder(helper, assistant=True), share_encoder=False, pad_id=pad),
                        prompt_lookup(ngram=2)):
            engine = AssistedDecoder(decoder, drafter, pad_id=pad)
            for policy in policies if batch > 1 else policies[2:]:
                got, drafted = [], 0
                for s in range(0, 5, batch):
                    r = engine.generate(prompts[s : s + batch], rules, DecodeOptions(max_new_tokens=max_new, policy=policy))
                    got += [list(t) for t in r.tokens]
                    drafted += r.stats.drafted
                assert got == expected, (dtype, batch, policy)
                assert drafted > 0


def test_options_are_checked():
    with pytest.raises(ValueError, match="weight dtype"):
        QuantizeOptions("int3")
    with pytest.raises(ValueError, match="group size"):
        QuantizeOptions("int4", 48)
    with pytest.raises(ValueError, match="dense rows"):
        QuantizeOptions("int4", dense_rows=-1)


def test_weight_dtypes_run_on_a_cpu_in_bfloat16_or_float32_and_are_refused_on_cuda(monkeypatch):
    from pipelines import devices

    with pytest.raises(devices.DeviceError, match="CPU only"):
        devices.resolve_dtype("cuda:0", "int4", "bfloat16")
    assert devices.resolve_dtype("cpu", "int8", "bfloat16") == "int8"
    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert devices.compute_dtype("cpu", "int4") == "bfloat16" and devices.compute_dtype("cpu", "float32") == "float32"
    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset({"avx2"}))
    assert devices.compute_dtype("cpu", "int8") == "float32"


def test_commands_offer_the_weight_dtypes_and_other_pairs_refuse_them(local_models_file, capsys):
    from pipelines.cli.parser import build_parser
    from pipelines.models.pairs import load_pair
    from pipelines.models.registry import RegistryError, load_registry

    parser = build_parser()
    for argv in (["translate", "--dtype", "int4", "x"], ["summarize", "--dtype", "int8", "x"],
                 ["bench", "text", "--dtype", "int4"], ["transcribe", "--dtype", "int4", "a.wav"],
                 ["eval", "-m", "whisper-base", "--set", "speech-real", "--dtype", "int8"],
                 ["eval", "-m", "qwen2.5-coder-1.5b+prompt-lookup", "--set", "summarize-own", "--dtype", "q4_k_m"]):
        assert parser.parse_args(argv).dtype == argv[argv.index("--dtype") + 1]
    assert parser.parse_args(["bench", "asr", "--dtypes", "float32, int8,int4"]).dtypes == ("float32", "int8", "int4")
    assert parser.parse_args(["bench", "asr"]).dtypes == ("float32", "bfloat16")
    for argv, wrong in ((["transcribe", "--dtype", "q4_k_m", "a.wav"], "q4_k_m"),  # llama.cpp runs text pairs only
                        (["bench", "asr", "--dtypes", "float32,int3"], "int3")):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        assert wrong in capsys.readouterr().err
    with pytest.raises(RegistryError, match="Whisper and Llama-layout"):  # before any weights load
        load_pair(load_registry(local_models_file).get("bart-pair"), "int8")
    with pytest.raises(RegistryError, match="GGUF file of an embedded text model"):  # eval's speech pairs too
        load_pair(load_registry().get("whisper-base"), "q4_k_m")

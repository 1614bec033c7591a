"""The step profile of issue 55 (pipelines/quality/profile_text.py, profile_steps.py): its grouping, the weight
bytes a step reads (from an IR's XML and from a torch model), and Tandem's plain steps timed and profiled by part
and by aten op on a small random Llama in int4. The real models' run (OpenVINO, llama.cpp, the 1.5B) is the
module's ``python -m`` entry, written down in docs/benchmarks.md."""

import torch
from toy_models import make_causal

from pipelines.engine import as_decoder
from pipelines.engine.causal import FixedCausalDecoder
from pipelines.models.quantize import quantize_model
from pipelines.quality.profile_steps import (
    Share,
    decoder_steps,
    shares,
    torch_step_profile,
    torch_weight_bytes,
    width_costs,
)
from pipelines.quality.profile_text import ir_weight_bytes, ov_part


def test_shares_sum_by_name_per_step_largest_first():
    got = shares([("a", 2.0), ("b", 6.0), ("a", 4.0), ("c", 0.0)], steps=2)
    assert got == [Share("a", 3.0, 0.5), Share("b", 3.0, 0.5), Share("c", 0.0, 0.0)]
    assert shares([("x", 0.0)]) == [Share("x", 0.0, 0.0)]


def test_openvino_nodes_fall_into_parts():
    assert ov_part("FullyConnected", "__module.model.layers.3.mlp.up_proj/aten::linear/MatMul") == "linear"
    assert ov_part("FullyConnected", "__module.lm_head/aten::linear/MatMul") == "head"
    assert ov_part("FullyConnectedCompressed", "__module.model.layers.0.self_attn.q_proj/MatMul") == "linear"
    assert ov_part("ScaledAttnWithKVCache", "sdpa_3") == "attention"
    assert ov_part("PagedAttentionExtension", "pa_3") == "attention"
    assert ov_part("RMS", "norm") == "rest"


IR = """<?xml version="1.0"?>
<net name="m" version="11"><layers>
<layer id="0" name="self.model.embed_tokens._openvino_orig_weight" type="Const" version="opset1">
 <data element_type="u8" shape="100, 8" offset="0" size="800" /></layer>
<layer id="1" name="self.model.layers.0.mlp.up_proj.weight" type="Const" version="opset1">
 <data element_type="u4" shape="16, 1, 8" offset="800" size="64" /></layer>
<layer id="2" name="self.model.layers.0.mlp.up_proj.weight/scale" type="Const" version="opset1">
 <data element_type="f16" shape="16, 1, 1" offset="864" size="32" /></layer>
<layer id="3" name="self.lm_head._openvino_orig_weight" type="Const" version="opset1">
 <data element_type="u8" shape="100, 8" offset="896" size="800" /></layer>
<layer id="4" name="input_ids" type="Parameter" version="opset1"><data shape="?,?" element_type="i64" /></layer>
</layers></net>
"""


def test_ir_weight_bytes_leave_the_embeddings_out(tmp_path):
    path = tmp_path / "openvino_model.xml"
    path.write_text(IR)
    assert ir_weight_bytes(path) == {"layers u4": 64, "layers f16": 32, "head u8": 800}


def test_tandem_int4_steps_are_timed_and_profiled_by_part_and_op():
    model = make_causal("llama", layers=2).to(torch.bfloat16)
    quantize_model(model, "int4", 32)
    # the toy: 2 layers of 7 linears (32 or 64 features) in int4 groups of 32, a bfloat16 head (VOCAB x 32)
    weights = torch_weight_bytes(model)
    assert weights["head bfloat16"] == model.lm_head.weight.numel() * 2
    assert weights["layers uint8"] == sum(m.packed.numel() for m in model.modules() if hasattr(m, "packed"))
    assert not any("embed" in k for k in weights)
    decoder = as_decoder(model)
    first, times = decoder_steps(decoder, [0, 5, 6, 7, 8], steps=3, pad_id=1)
    assert first > 0 and len(times) == 3 and all(t > 0 for t in times)
    parts, ops = torch_step_profile(decoder, [0, 5, 6, 7, 8], steps=2, pad_id=1, top=None)
    by_part = {s.name: s for s in parts}
    assert set(by_part) == {"linear", "head", "attention", "rest"}
    assert all(by_part[p].ms > 0 for p in ("linear", "head", "attention"))
    assert abs(sum(s.share for s in parts) - 1) < 1e-3
    assert "aten::_weight_int4pack_mm_for_cpu" in {s.name for s in ops}
    assert "attend" not in vars(decoder) and "_head" not in vars(decoder)  # the regions are gone after
    widths = width_costs(lambda w: FixedCausalDecoder(model, width=w), (1, 3), [0, 5, 6, 7, 8], 2, pad_id=1)
    assert set(widths) == {1, 3} and all(ms > 0 for ms in widths.values())

"""CTranslate2 Whisper files -> a transformers ``WhisperForConditionalGeneration`` folder: the architecture
read off the tensor shapes, the weights renamed (fused projections split), the tokenizer with timestamp
tokens, the feature extractor and the generation config (Whisper's language and task tokens, suppressions)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from .cache import EmbeddedModelError
from .ct2 import CT2Model

MULTILINGUAL_VOCAB = 51865  # Whisper's multilingual vocabularies have this many tokens or more; .en ones 51864


def _count_layers(names, prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"/layer_(\d+)/")
    return len({m.group(1) for n in names if (m := pattern.match(n))})


def whisper_config_from_ct2(ct2: CT2Model, special: dict[str, int]):
    """Read the architecture off the tensor shapes; token ids come from the tokenizer."""
    from transformers import WhisperConfig

    v = ct2.variables
    d_model, n_mels, _ = v["encoder/conv1/weight"].shape
    return WhisperConfig(
        vocab_size=v["decoder/embeddings/weight"].shape[0],
        num_mel_bins=int(n_mels),
        d_model=int(d_model),
        encoder_layers=_count_layers(v, "encoder"),
        decoder_layers=_count_layers(v, "decoder"),
        encoder_attention_heads=int(v["encoder/num_heads"]),
        decoder_attention_heads=int(v["decoder/num_heads"]),
        encoder_ffn_dim=v["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=v["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=v["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=v["decoder/position_encodings/encodings"].shape[0],
        pad_token_id=special["eot"],
        bos_token_id=special["eot"],
        eos_token_id=special["eot"],
        decoder_start_token_id=special["sot"],
        tie_word_embeddings=True,
    )


def _split_rows(w: np.ndarray, n: int) -> list[np.ndarray]:
    return np.split(w, n, axis=0)


def whisper_state_dict(ct2: CT2Model) -> dict[str, np.ndarray]:
    """Map CTranslate2 names to transformers names, unfusing q/k/v (Whisper's k has no bias)."""
    v = ct2.variables
    out: dict[str, np.ndarray] = {}

    def ln(dst: str, src: str) -> None:
        out[dst + ".weight"], out[dst + ".bias"] = v[src + "/gamma"], v[src + "/beta"]

    def lin(dst: str, src: str) -> None:
        out[dst + ".weight"], out[dst + ".bias"] = v[src + "/weight"], v[src + "/bias"]

    def qkv(dst: str, src: str, names: tuple[str, ...]) -> None:
        ws = _split_rows(v[src + "/weight"], len(names))
        bs = _split_rows(v[src + "/bias"], len(names))
        for name, w, b in zip(names, ws, bs):
            out[f"{dst}.{name}.weight"] = w
            if name != "k_proj":
                out[f"{dst}.{name}.bias"] = b

    # the parts every encoder and decoder layer has: self-attention (fused q/k/v) and the feed-forward block
    def self_attention(d: str, s: str) -> None:
        qkv(f"{d}.self_attn", f"{s}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
        lin(f"{d}.self_attn.out_proj", f"{s}/self_attention/linear_1")
        ln(f"{d}.self_attn_layer_norm", f"{s}/self_attention/layer_norm")

    def ffn(d: str, s: str) -> None:
        lin(f"{d}.fc1", f"{s}/ffn/linear_0")
        lin(f"{d}.fc2", f"{s}/ffn/linear_1")
        ln(f"{d}.final_layer_norm", f"{s}/ffn/layer_norm")

    enc, dec = "model.encoder", "model.decoder"
    for i in (1, 2):
        lin(f"{enc}.conv{i}", f"encoder/conv{i}")
    out[f"{enc}.embed_positions.weight"] = v["encoder/position_encodings/encodings"]
    for i in range(_count_layers(v, "encoder")):
        s, d = f"encoder/layer_{i}", f"{enc}.layers.{i}"
        self_attention(d, s)
        ffn(d, s)
    ln(f"{enc}.layer_norm", "encoder/layer_norm")

    out[f"{dec}.embed_tokens.weight"] = v["decoder/embeddings/weight"]
    out[f"{dec}.embed_positions.weight"] = v["decoder/position_encodings/encodings"]
    for i in range(_count_layers(v, "decoder")):
        s, d = f"decoder/layer_{i}", f"{dec}.layers.{i}"
        self_attention(d, s)
        lin(f"{d}.encoder_attn.q_proj", f"{s}/attention/linear_0")
        qkv(f"{d}.encoder_attn", f"{s}/attention/linear_1", ("k_proj", "v_proj"))
        lin(f"{d}.encoder_attn.out_proj", f"{s}/attention/linear_2")
        ln(f"{d}.encoder_attn_layer_norm", f"{s}/attention/layer_norm")
        ffn(d, s)
    ln(f"{dec}.layer_norm", "decoder/layer_norm")
    return out


def build_whisper_tokenizer(aux: Path, vocab_size: int):
    """The BPE and special tokens from the package's tokenizer.json, plus the 1,501 timestamp tokens."""
    from tokenizers import AddedToken
    from transformers import WhisperTokenizer

    tj = json.loads((aux / "tokenizer.json").read_text(encoding="utf-8"))
    specials = sorted(tj["added_tokens"], key=lambda t: t["id"])
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in tj["model"]["merges"]]
    tok = WhisperTokenizer(vocab=tj["model"]["vocab"], merges=merges)
    extra = [AddedToken(t["content"], special=True, normalized=False) for t in specials]
    tok.add_special_tokens({"additional_special_tokens": extra})
    n_timestamps = vocab_size - len(tok)
    tok.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", normalized=False) for i in range(n_timestamps)])
    if len(tok) != vocab_size:
        raise EmbeddedModelError(f"tokenizer has {len(tok)} tokens, model expects {vocab_size}")
    for t in specials:
        if tok.convert_tokens_to_ids(t["content"]) != t["id"]:
            raise EmbeddedModelError(f"special token {t['content']} did not keep id {t['id']}")
    return tok


def _special_ids(tok) -> dict[str, int]:
    ids = tok.convert_tokens_to_ids
    return {
        "eot": ids("<|endoftext|>"),
        "sot": ids("<|startoftranscript|>"),
        "translate": ids("<|translate|>"),
        "transcribe": ids("<|transcribe|>"),
        "prev": ids("<|startofprev|>"),
        "notimestamps": ids("<|notimestamps|>"),
    }


def is_multilingual_vocab(vocab_size: int) -> bool:
    """Whisper's own test (openai/whisper ``Whisper.is_multilingual``): an English-only (``.en``) model has a
    vocabulary of 51,864 tokens, a multilingual one 51,865 or more. The language tokens are in both
    vocabularies, so their presence says nothing."""
    return vocab_size >= MULTILINGUAL_VOCAB


def _generation_config(aux: Path, tok, special: dict[str, int], config):
    from transformers import GenerationConfig

    meta = json.loads((aux / "config.json").read_text())
    lang_ids = set(meta["lang_ids"])
    lang_to_id = {t: i for t, i in tok.get_vocab().items() if i in lang_ids}
    multilingual = is_multilingual_vocab(config.vocab_size)
    return GenerationConfig(
        decoder_start_token_id=special["sot"],
        eos_token_id=special["eot"],
        pad_token_id=special["eot"],
        bos_token_id=special["eot"],
        max_length=config.max_target_positions,
        suppress_tokens=list(meta["suppress_ids"]),
        begin_suppress_tokens=list(meta["suppress_ids_begin"]),
        alignment_heads=[list(h) for h in meta["alignment_heads"]],
        no_timestamps_token_id=special["notimestamps"],
        prev_sot_token_id=special["prev"],
        is_multilingual=multilingual,
        lang_to_id=lang_to_id if multilingual else {},
        task_to_id={"transcribe": special["transcribe"], "translate": special["translate"]}
        if multilingual
        else {},
        max_initial_timestamp_index=50,
        return_timestamps=False,
    )


def convert_whisper(ct2: CT2Model, aux: Path, out: Path) -> None:
    """Write a complete transformers Whisper folder for ``ct2`` into ``out``."""
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    if ct2.spec != "WhisperSpec":
        raise EmbeddedModelError(f"expected a WhisperSpec model.bin, got {ct2.spec}")
    vocab_size = ct2.variables["decoder/embeddings/weight"].shape[0]
    tok = build_whisper_tokenizer(aux, vocab_size)
    special = _special_ids(tok)
    config = whisper_config_from_ct2(ct2, special)
    # Keep the shipped fp16 values exactly; callers choose the compute dtype when loading.
    config.dtype = "float16"
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    state = {k: torch.from_numpy(np.array(a)) for k, a in whisper_state_dict(ct2).items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if k != "proj_out.weight"]  # tied to the token embeddings
    if missing or unexpected:
        raise EmbeddedModelError(f"conversion mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    model.generation_config = _generation_config(aux, tok, special, config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    WhisperFeatureExtractor(feature_size=config.num_mel_bins).save_pretrained(out)


def repair_language_flag(folder: Path) -> bool:
    """Conversions before ``is_multilingual_vocab`` marked English-only models multilingual (tiny.en got
    ``is_multilingual: true`` and 98 language tokens, so it was prompted with a language token it never
    learnt). Rewrite such a folder's generation_config.json in place (atomically; the weights and their
    stamp are untouched). Returns whether it was rewritten."""
    gen_path = folder / "generation_config.json"
    gen = json.loads(gen_path.read_text())
    multilingual = is_multilingual_vocab(json.loads((folder / "config.json").read_text())["vocab_size"])
    if bool(gen.get("is_multilingual")) == multilingual:
        return False
    gen["is_multilingual"] = multilingual
    if not multilingual:
        gen["lang_to_id"], gen["task_to_id"] = {}, {}
    tmp = gen_path.with_name(f".{gen_path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, gen_path)
    return True

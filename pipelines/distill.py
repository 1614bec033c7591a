"""Distil a small assistant for a main model that has none (sequence-level knowledge distillation, the way
distil-whisper was made), resumably and within a time budget.

corpus   ASR: sentences of Debian package descriptions (apt's English index) that no evaluation set holds,
         spoken by varied voices (flite kal/kal16/awb/rms/slt at random speed and pitch, Piper joe at random
         speed), either as a short clip of 1-2 sentences (decoded with <|notimestamps|>) or as a 30 s window
         of sentences and pauses (decoded with timestamps, as long-form transcription asks).
         Text models: source lines from the given text files.
label    the main model's own greedy output, decoded by Tandem's batched engine, written in shards; each
         shard keeps the encoder output (float16), prompts, labels and the teacher's top-8 log-probabilities.
         Shard 0 is held out.
train    a shallow decoder initialised from the main decoder's layers (the first and the last, others spread
         between), token/position embeddings and head tied to the main model's and frozen, the encoder the
         main model's own (frozen: its output is shared exactly). Loss per label position t:
             CE(teacher token_t) + w * sum_{i in top-8} p_T(i) * (log p_T(i) - log p_S(i))
         Checkpoints are atomic; a run stops at its budget and ``--resume`` goes on from the last one.
export   Whisper: the distinct layers only (bfloat16 safetensors), the draft vocabulary, a checksum and a
         card: ``pipelines/embedded.py`` assembles a ``WhisperForCausalLM`` around the main model's
         embeddings. Text models: a full transformers folder with the same tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .audio import SAMPLE_RATE
from .evalsets import Speaker
from .loading import ModelRef

TOPK = 8
HELDOUT_SHARD = 0
WINDOW_SECONDS = 30.0
FLITE_VOICES = {"kal": (85, 125), "kal16": (85, 125), "awb": (90, 130), "rms": (80, 120), "slt": (150, 210)}


class DistillError(RuntimeError):
    """The distillation cannot go on; the message says why."""


@dataclass(frozen=True)
class DistillOptions:
    main: str  # a pair name (its main model), an embedded name, a local folder or a hub id
    out: Path
    layers: int = 2
    data: tuple[str, ...] = ("debian-speech",)  # ASR: debian-speech; text models: text files, one input a line
    clips: int = 4000  # training items to build and label (held-out shard not counted)
    heldout: int = 96
    shard_size: int = 64
    epochs: float = 3.0
    batch_size: int = 16
    lr: float = 3e-4
    kl_weight: float = 0.8
    draft_vocab: int = 16384  # most frequent label tokens kept by the draft head (plus all special tokens); 0: full
    budget_minutes: float | None = None
    resume: bool = False
    seed: int = 20261129
    eval_every: int = 50  # optimizer steps between held-out estimates and checkpoints
    threads: int | None = None


@dataclass(frozen=True)
class HeldOut:
    agreement: float  # teacher-forced top-1 agreement with the teacher's tokens
    tokens_per_call: float  # simulated at lookahead 5: accepted run + the main model's own token
    coverage: float  # share of teacher tokens inside the draft vocabulary


# ----------------------------------------------------------------------------------------------------
# The main model


def resolve_main(name: str) -> ModelRef:
    """A pair name gives its main model; otherwise an embedded name, an existing folder, or a hub id."""
    from .embedded import embedded_names
    from .registry import load_registry

    try:
        registry = load_registry()
        if name in registry.pairs:
            return registry.pairs[name].main
    except Exception:  # a broken models.yaml must not hide an explicit model
        pass
    if name in embedded_names():
        return ModelRef("embedded", name)
    if Path(name).is_dir():
        return ModelRef("local", str(Path(name).resolve()))
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        return ModelRef("hub", name, "main")
    raise DistillError(f"--main {name!r} is neither a pair, an embedded model, a folder nor a hub id")


# ----------------------------------------------------------------------------------------------------
# Corpus: spoken Debian descriptions


_CLEAN = re.compile(r"^[A-Za-z][A-Za-z0-9 ,.;:'()!?-]+[.!?]$")


def debian_sentences(exclude: set[str]) -> list[str]:
    """Sentences of 5-30 plain words from Debian's English descriptions, de-duplicated, sorted."""
    from .evalsets import debian_descriptions

    out = set()
    for _, _, long in debian_descriptions():
        for s in re.split(r"(?<=[.!?])\s+", long):
            s = s.strip()
            if 5 <= len(s.split()) <= 30 and _CLEAN.match(s) and "http" not in s and s not in exclude:
                out.add(s)
    return sorted(out)


def _voice(rng: random.Random) -> dict:
    """A random voice: Piper joe at a random speed (30%), or a flite voice at a random speed and pitch."""
    if rng.random() < 0.3:
        return {"voice": "piper:joe", "piper": {"length_scale": round(rng.uniform(0.85, 1.25), 2)}}
    name = rng.choice(sorted(FLITE_VOICES))
    lo, hi = FLITE_VOICES[name]
    return {"voice": f"flite:{name}",
            "flite": {"duration_stretch": round(rng.uniform(0.85, 1.25), 2), "int_f0_target_mean": rng.randint(lo, hi)}}


def _speak(speaker: Speaker, voice: dict, text: str, tmp: Path) -> np.ndarray:
    return speaker.render(voice["voice"], text, tmp, flite_setf=voice.get("flite"), piper_config=voice.get("piper"))


def _augment(samples: np.ndarray, rng: random.Random) -> np.ndarray:
    """Random gain, and now and then faint white noise (SNR 25-40 dB)."""
    out = samples * rng.uniform(0.3, 1.0)
    if rng.random() < 0.3 and len(out):
        power = float(np.mean(out**2)) + 1e-12
        snr = rng.uniform(25, 40)
        noise = np.random.default_rng(rng.randrange(2**31)).standard_normal(len(out)).astype(np.float32)
        out = out + noise * np.sqrt(power / 10 ** (snr / 10))
    return out.astype(np.float32)


def speech_items(shard: int, size: int, sentences: list[str], heldout_pool: int, seed: int,
                 speaker: Speaker, tmp: Path) -> list[dict]:
    """One shard's items: a short clip (60%) or a 30 s window of sentences and pauses (40%)."""
    rng = random.Random(seed * 100_003 + shard)
    pool = sentences[:heldout_pool] if shard == HELDOUT_SHARD else sentences[heldout_pool:]
    items = []
    for i in range(size):
        voice = _voice(rng)
        if rng.random() < 0.6:
            texts = [rng.choice(pool) for _ in range(rng.choice((1, 1, 2)))]
            audio = _augment(_speak(speaker, voice, " ".join(texts), tmp), rng)[: int(WINDOW_SECONDS * SAMPLE_RATE)]
            items.append({"kind": "clip", "text": " ".join(texts), "voice": voice, "audio": audio})
            continue
        pieces, texts, t = [], [], 0.0
        # long-form windows start just before speech (the previous window ended at a segment)
        lead = rng.uniform(0.0, 0.8)
        pieces.append(np.zeros(int(lead * SAMPLE_RATE), np.float32))
        t = lead
        while t < WINDOW_SECONDS + 2:
            text = rng.choice(pool)
            speech = _speak(speaker, voice, text, tmp)
            pause = np.zeros(int(rng.uniform(0.4, 1.2) * SAMPLE_RATE), np.float32)
            pieces += [speech, pause]
            texts.append(text)
            t += (len(speech) + len(pause)) / SAMPLE_RATE
        audio = _augment(np.concatenate(pieces), rng)
        # a final window of a recording is shorter: keep a fifth of the windows whole but short
        cut = WINDOW_SECONDS if rng.random() < 0.8 else rng.uniform(8.0, WINDOW_SECONDS)
        items.append({"kind": "window", "text": " ".join(texts), "voice": voice,
                      "audio": audio[: int(cut * SAMPLE_RATE)]})
    return items


def text_items(shard: int, size: int, lines: list[str], heldout_pool: int, seed: int) -> list[dict]:
    rng = random.Random(seed * 100_003 + shard)
    pool = lines[:heldout_pool] if shard == HELDOUT_SHARD else lines[heldout_pool:]
    if not pool:
        raise DistillError("the text corpus is too small for a held-out part and a training part")
    return [{"kind": "text", "text": rng.choice(pool)} for _ in range(size)]


def read_text_lines(paths: tuple[str, ...]) -> list[str]:
    lines: list[str] = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise DistillError(f"--data {p!r}: not a text file (text models learn from files of one input a line)")
        lines += [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if len(lines) < 4:
        raise DistillError("--data holds fewer than 4 non-empty lines")
    return sorted(set(lines))


# ----------------------------------------------------------------------------------------------------
# Labelling with the main model (Tandem's engine, batched)


class Teacher:
    """The main model, its engine (plain decoding) and how its prompts and rules are made: for Whisper those
    of the ASR pipeline itself (``WhisperRunner``), so labels are decoded exactly as transcription decodes."""

    def __init__(self, ref: ModelRef, dtype: str) -> None:
        import torch

        from .pairs import load_pair
        from .registry import Pair

        self.torch = torch
        self.ref = ref
        self.is_whisper = _is_whisper_ref(ref)
        pair = Pair(name=f"distill-teacher {ref}", task="asr" if self.is_whisper else "summarize", main=ref,
                    assistant=None, draft="none", share_encoder=False, dtype=dtype)
        if self.is_whisper:
            from .asr import WhisperRunner

            self.runner = WhisperRunner(pair, dtype)
            loaded = self.runner.loaded
        else:
            self.runner = None
            loaded = load_pair(pair, dtype)
        self.model, self.decoder, self.tokenizer = loaded.main_model, loaded.main, loaded.tokenizer
        self.engine = loaded.plain
        self.gen = self.model.generation_config

    def prompt(self, kind: str) -> list[int]:
        if self.is_whisper:  # English transcription; windows of long-form audio decode with timestamps
            return self.runner.prompt("en", "transcribe", timestamps=kind == "window")
        prompt = [self.gen.decoder_start_token_id]
        bos = getattr(self.gen, "forced_bos_token_id", None)
        return prompt + ([bos] if bos is not None else [])

    def rules(self, prompt_len: int, kind: str, max_new: int):
        if self.is_whisper:
            return self.runner.rules(prompt_len, kind == "window", max_new)
        from .engine import rules_from_generation_config

        return rules_from_generation_config(self.gen, prompt_len, max_new)

    def encode(self, items: list[dict]):
        with self.torch.inference_mode():
            if self.is_whisper:
                return self.decoder.encode(input_features=self.runner.feats([it["audio"] for it in items]))
            limit = min(getattr(self.model.config, "max_position_embeddings", 512) or 512, 512)
            x = self.tokenizer([it["text"] for it in items], return_tensors="pt", padding=True, truncation=True,
                               max_length=limit)
            return self.decoder.encode(input_ids=x.input_ids, attention_mask=x.attention_mask)

    def label(self, items: list[dict], max_new: int) -> tuple[np.ndarray, np.ndarray | None, list[list[int]], list[list[int]]]:
        """Encoder output (float16), its mask, prompts and the greedy labels of a group of items."""
        from .engine import DecodeOptions

        enc = self.encode(items)
        prompts = [self.prompt(it["kind"]) for it in items]
        labels: list[list[int]] = [[] for _ in items]
        for kind in sorted({it["kind"] for it in items}):
            rows = [i for i, it in enumerate(items) if it["kind"] == kind]
            sub = enc.select(self.torch.tensor(rows))
            rules = self.rules(len(prompts[rows[0]]), kind, max_new)
            result = self.engine.generate([prompts[i] for i in rows], rules, DecodeOptions(max_new_tokens=max_new),
                                          encoder_output=sub)
            for i, toks in zip(rows, result.tokens):
                labels[i] = list(toks)
        mask = None if enc.mask is None else enc.mask.numpy().astype(np.int8)
        return enc.hidden.float().numpy().astype(np.float16), mask, prompts, labels

    def topk(self, hidden: np.ndarray, mask: np.ndarray | None, prompts, labels) -> tuple[np.ndarray, np.ndarray]:
        """The teacher's top-k log-probabilities at every label position (teacher forcing)."""
        torch = self.torch
        logits = forced_logits(self.model, torch.from_numpy(hidden).to(self.model.dtype),
                               None if mask is None else torch.from_numpy(mask).long(), prompts, labels)
        ids, lps = [], []
        for b, (p, y) in enumerate(zip(prompts, labels)):
            lp = torch.log_softmax(logits[b, len(p) - 1 : len(p) - 1 + len(y)].float(), dim=-1)
            v, i = lp.topk(TOPK, dim=-1)
            ids.append(i.numpy().astype(np.int32))
            lps.append(v.numpy().astype(np.float16))
        return np.concatenate(ids), np.concatenate(lps)


def forced_logits(model, hidden, enc_mask, prompts: list[list[int]], labels: list[list[int]], grad: bool = False):
    """Logits (B, L, V) of a Whisper/encoder-decoder/decoder-only-over-encoder model fed prompt + labels
    (right-padded: causal attention keeps the padding from touching earlier positions)."""
    import torch

    seqs = [list(p) + list(y) for p, y in zip(prompts, labels)]
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [s[-1]] * (width - len(s)) for s in seqs])
    ctx = torch.enable_grad() if grad else torch.inference_mode()
    with ctx:
        if model.config.model_type == "whisper" and not model.config.is_encoder_decoder:
            return model(input_ids=ids, encoder_outputs=(hidden,), use_cache=False).logits
        from transformers.modeling_outputs import BaseModelOutput

        return model(encoder_outputs=BaseModelOutput(last_hidden_state=hidden), attention_mask=enc_mask,
                     decoder_input_ids=ids, use_cache=False).logits


# ----------------------------------------------------------------------------------------------------
# Shards on disk


def shard_dir(out: Path, shard: int) -> Path:
    return out / "shards" / f"{shard:05d}"


def shard_done(out: Path, shard: int) -> bool:
    return (shard_dir(out, shard) / "items.json").is_file()


def write_shard(out: Path, shard: int, hidden, mask, items, prompts, labels, topk_ids, topk_lp) -> None:
    final = shard_dir(out, shard)
    tmp = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "enc.npy", hidden)
    if mask is not None:
        np.save(tmp / "mask.npy", mask)
    np.save(tmp / "topk_ids.npy", topk_ids)
    np.save(tmp / "topk_lp.npy", topk_lp)
    meta = [{"kind": it["kind"], "text": it["text"], "voice": it.get("voice"), "prompt": p, "labels": y}
            for it, p, y in zip(items, prompts, labels)]
    (tmp / "items.json").write_text(json.dumps(meta))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)


@dataclass
class Shard:
    enc: np.ndarray  # memory-mapped (n, T, d) float16
    mask: np.ndarray | None
    items: list[dict]
    topk_ids: np.ndarray
    topk_lp: np.ndarray
    offsets: list[int]  # start of each item's label positions in the top-k arrays


def read_shard(out: Path, shard: int) -> Shard:
    d = shard_dir(out, shard)
    items = json.loads((d / "items.json").read_text())
    offsets, acc = [], 0
    for it in items:
        offsets.append(acc)
        acc += len(it["labels"])
    mask = np.load(d / "mask.npy") if (d / "mask.npy").is_file() else None
    return Shard(np.load(d / "enc.npy", mmap_mode="r"), mask, items, np.load(d / "topk_ids.npy"),
                 np.load(d / "topk_lp.npy"), offsets)


def build_corpus(opts: DistillOptions, teacher: Teacher, deadline: float | None, log) -> int:
    """Build and label shards until ``opts.clips`` training items exist (or the deadline); returns the
    number of training shards done. Each shard is written atomically, so a stopped run loses at most one."""
    n_train = -(-opts.clips // opts.shard_size)
    todo = [s for s in range(n_train + 1) if not shard_done(opts.out, s)]
    if not todo:
        return n_train
    tmp = opts.out / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    if teacher.is_whisper:
        from .evalsets import project_sentences

        sentences = debian_sentences(set(project_sentences()))
        rng = random.Random(opts.seed)
        rng.shuffle(sentences)
        speaker = Speaker()

        def make(s: int) -> list[dict]:
            size = opts.heldout if s == HELDOUT_SHARD else opts.shard_size
            return speech_items(s, size, sentences, 2000, opts.seed, speaker, tmp / f"tts{s}.wav")
        max_new = 440
    else:
        lines = read_text_lines(opts.data)
        rng = random.Random(opts.seed)
        rng.shuffle(lines)
        pool = max(1, min(len(lines) // 5, 500))

        def make(s: int) -> list[dict]:
            size = opts.heldout if s == HELDOUT_SHARD else opts.shard_size
            return text_items(s, size, lines, pool, opts.seed)
        max_new = min(int(getattr(teacher.gen, "max_length", 128) or 128), 256)

    # synthesise the next shard while this one is labelled (flite runs in its own process)
    with ThreadPoolExecutor(1) as pool_ex:
        future = pool_ex.submit(make, todo[0])
        for k, s in enumerate(todo):
            if deadline is not None and time.time() > deadline:
                future.cancel()
                break
            items = future.result()
            if k + 1 < len(todo):
                future = pool_ex.submit(make, todo[k + 1])
            t0 = time.perf_counter()
            hidden, mask, prompts, labels, ids, lps = [], [], [], [], [], []
            for g in range(0, len(items), 16):
                h, m, p, y = teacher.label(items[g : g + 16], max_new)
                i, lp = teacher.topk(h, m, p, y)
                hidden.append(h), mask.append(m), prompts.extend(p), labels.extend(y), ids.append(i), lps.append(lp)
            if mask[0] is not None:
                width = max(h.shape[1] for h in hidden)
                hidden = [np.pad(h, ((0, 0), (0, width - h.shape[1]), (0, 0))) for h in hidden]
                mask = [np.pad(m, ((0, 0), (0, width - m.shape[1]))) for m in mask]
            hidden = np.concatenate(hidden)
            mask = None if mask[0] is None else np.concatenate(mask)
            write_shard(opts.out, s, hidden, mask, items, prompts, labels, np.concatenate(ids), np.concatenate(lps))
            log(f"shard {s}: {len(items)} items, {sum(map(len, labels))} label tokens, "
                f"{time.perf_counter() - t0:.1f} s labelling")
    return sum(shard_done(opts.out, s) for s in range(1, n_train + 1))


# ----------------------------------------------------------------------------------------------------
# The student


def spread_layers(total: int, n: int) -> list[int]:
    """n of total layers, the first and the last included, the rest evenly between."""
    if n >= total:
        return list(range(total))
    if n == 1:
        return [total - 1]
    return sorted({round(i * (total - 1) / (n - 1)) for i in range(n)})


def make_student(main, n_layers: int):
    """A shallow copy of the main model's decoder: layers spread over the main's, embeddings and head shared
    (frozen); for Whisper a ``WhisperForCausalLM`` that reads the main encoder's output."""
    import copy

    import torch

    keep = spread_layers(_decoder_layers(main), n_layers)
    if main.config.model_type == "whisper":
        from transformers import WhisperForCausalLM

        config = main.config.__class__.from_dict(main.config.to_dict())
        config.decoder_layers, config.is_encoder_decoder = len(keep), False
        student = WhisperForCausalLM(config).to(main.dtype)
        src, dst = main.model.decoder, student.model.decoder
        dst.embed_tokens = src.embed_tokens
        dst.embed_positions = src.embed_positions
        dst.layer_norm.load_state_dict(src.layer_norm.state_dict())
        for j, i in enumerate(keep):
            dst.layers[j].load_state_dict(src.layers[i].state_dict())
        student.proj_out = main.proj_out
    else:
        student = copy.deepcopy(main)
        dec = student.get_decoder()
        layers = dec.block if hasattr(dec, "block") else dec.layers
        kept = torch.nn.ModuleList([layers[i] for i in keep])
        if hasattr(dec, "block"):
            dec.block = kept
            student.config.num_decoder_layers = len(keep)
            for j, blk in enumerate(kept):  # only T5's first block owns the relative bias table
                blk.layer[0].SelfAttention.has_relative_attention_bias = j == 0
        else:
            dec.layers = kept
            student.config.decoder_layers = len(keep)
    student.config.distill_init_layers = keep
    for p in student.parameters():
        p.requires_grad_(False)
    for p in _trainable(student):
        p.requires_grad_(True)
    return student


def _decoder_layers(model) -> int:
    c = model.config
    return getattr(c, "decoder_layers", None) or getattr(c, "num_decoder_layers", None) or c.num_layers


def _trainable(student) -> list:
    """The decoder layers and the final norm; embeddings, encoder and head stay the main model's."""
    dec = student.model.decoder if student.config.model_type == "whisper" else student.get_decoder()
    params = []
    for name, p in dec.named_parameters():
        if not name.startswith(("embed_tokens", "embed_positions")) and "relative_attention_bias" not in name:
            params.append(p)
    return params


def draft_vocabulary(out: Path, shards: list[int], size: int, vocab: int, always: list[int]) -> list[int]:
    """The ``size`` most frequent label tokens of the training shards, plus ``always`` (special and timestamp
    tokens); sorted. size 0: the whole vocabulary."""
    if size <= 0:
        return list(range(vocab))
    counts: Counter = Counter()
    for s in shards:
        for it in json.loads((shard_dir(out, s) / "items.json").read_text()):
            counts.update(it["labels"])
    return sorted({t for t, _ in counts.most_common(size)} | set(always))


# ----------------------------------------------------------------------------------------------------
# Training


def _batch(shards: dict[int, Shard], picks: list[tuple[int, int]]):
    import torch

    hid = [np.asarray(shards[s].enc[i], dtype=np.float32) for s, i in picks]
    mask = None
    if shards[picks[0][0]].mask is not None:
        width = max(h.shape[0] for h in hid)
        hid = [np.pad(h, ((0, width - h.shape[0]), (0, 0))) for h in hid]
        mask = torch.tensor(np.stack([np.pad(shards[s].mask[i], (0, width - shards[s].mask.shape[1]))
                                      for s, i in picks]), dtype=torch.long)
    prompts = [shards[s].items[i]["prompt"] for s, i in picks]
    labels = [shards[s].items[i]["labels"] for s, i in picks]
    tk_ids = [shards[s].topk_ids[shards[s].offsets[i] : shards[s].offsets[i] + len(labels[b])] for b, (s, i) in enumerate(picks)]
    tk_lp = [shards[s].topk_lp[shards[s].offsets[i] : shards[s].offsets[i] + len(labels[b])] for b, (s, i) in enumerate(picks)]
    return torch.from_numpy(np.stack(hid)), mask, prompts, labels, tk_ids, tk_lp


def distill_loss(student, batch, kl_weight: float):
    """Mean over label positions of CE(teacher token) + kl_weight * KL(teacher top-k || student)."""
    import torch

    hidden, mask, prompts, labels, tk_ids, tk_lp = batch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = forced_logits(student, hidden, mask, prompts, labels, grad=True)
    total, count = 0.0, 0
    for b, (p, y) in enumerate(zip(prompts, labels)):
        lp = torch.log_softmax(logits[b, len(p) - 1 : len(p) - 1 + len(y)].float(), dim=-1)
        ce = -lp.gather(1, torch.tensor(y)[:, None]).sum()
        t_lp = torch.from_numpy(tk_lp[b].astype(np.float32))
        kl = (t_lp.exp() * (t_lp - lp.gather(1, torch.from_numpy(tk_ids[b]).long()))).sum()
        total = total + ce + kl_weight * kl
        count += len(y)
    return total / max(count, 1)


def evaluate_heldout(student, shard: Shard, vocab: list[int] | None, lookahead: int = 5) -> HeldOut:
    """Teacher-forced agreement and, from it, tokens per main call at a constant lookahead: drafts agree
    while the student's argmax (over the draft vocabulary) equals the teacher's token, so each main call
    yields (agreeing run, at most ``lookahead``) + 1 tokens."""
    import torch

    agree = total = calls = emitted = covered = 0
    keep = None if vocab is None else torch.tensor(vocab)
    for g in range(0, len(shard.items), 16):
        picks = [(0, i) for i in range(g, min(g + 16, len(shard.items)))]
        hidden, mask, prompts, labels, _, _ = _batch({0: shard}, picks)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = forced_logits(student, hidden, mask, prompts, labels)
        for b, (p, y) in enumerate(zip(prompts, labels)):
            lg = logits[b, len(p) - 1 : len(p) - 1 + len(y)].float()
            pred = lg.argmax(-1) if keep is None else keep[lg[:, keep].argmax(-1)]
            hits = (pred == torch.tensor(y)).tolist()
            agree += sum(hits)
            total += len(y)
            covered += len(y) if keep is None else int(torch.isin(torch.tensor(y), keep).sum())
            t = 0
            while t < len(y):
                run = 0
                while run < lookahead and t + run < len(y) and hits[t + run]:
                    run += 1
                step = min(run + 1, len(y) - t)
                t += step
                emitted += step
                calls += 1
    return HeldOut(agree / max(total, 1), emitted / max(calls, 1), covered / max(total, 1))


def _save_checkpoint(path: Path, state: dict) -> None:
    import torch

    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(opts: DistillOptions, teacher: Teacher, shards_ids: list[int], deadline: float | None, log) -> dict:
    """Train (or go on training) the student; returns the training state summary."""
    import torch

    from tqdm import tqdm

    out = opts.out / "train"
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint.pt"
    student = make_student(teacher.model, opts.layers).float()
    params = [p for p in student.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=opts.lr, weight_decay=0.01)
    state = {"step": 0, "seen": 0, "best": None, "curve": [], "seconds": 0.0}
    if ckpt.is_file():
        saved = torch.load(ckpt, weights_only=False)
        student.load_state_dict(saved["student"], strict=False)
        optim.load_state_dict(saved["optim"])
        state = saved["state"]
        log(f"resumed at step {state['step']} ({state['seen']} clips seen)")
    shards = {s: read_shard(opts.out, s) for s in shards_ids}
    heldout = read_shard(opts.out, HELDOUT_SHARD)
    order = [(s, i) for s in shards_ids for i in range(len(shards[s].items))]
    steps_total = int(opts.epochs * len(order) / opts.batch_size)
    always = list(range(teacher.tokenizer.convert_tokens_to_ids(teacher.tokenizer.eos_token) or 0,
                        teacher.model.config.vocab_size)) if teacher.is_whisper else list(teacher.tokenizer.all_special_ids)
    vocab = draft_vocabulary(opts.out, shards_ids, opts.draft_vocab, teacher.model.config.vocab_size, always)
    # warm-up then cosine decay, by step
    def lr_at(step: int) -> float:
        warm = max(1, min(100, steps_total // 20))
        if step < warm:
            return opts.lr * (step + 1) / warm
        return opts.lr * 0.5 * (1 + np.cos(np.pi * min(1.0, (step - warm) / max(1, steps_total - warm))))

    bar = tqdm(total=steps_total, initial=state["step"], desc="distil", unit="step")
    t_run = time.perf_counter()
    student.train()
    while state["step"] < steps_total:
        if deadline is not None and time.time() > deadline:
            log("budget reached: stopping (resume with --resume)")
            break
        epoch, pos = divmod(state["step"] * opts.batch_size, len(order))
        perm = list(order)
        random.Random(opts.seed + epoch).shuffle(perm)
        picks = perm[pos : pos + opts.batch_size]
        for g in optim.param_groups:
            g["lr"] = lr_at(state["step"])
        loss = distill_loss(student, _batch(shards, picks), opts.kl_weight)
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optim.step()
        state["step"] += 1
        state["seen"] += len(picks)
        bar.update(1)
        loss = loss.detach()
        bar.set_postfix(loss=f"{float(loss):.3f}")
        if state["step"] % opts.eval_every == 0 or state["step"] == steps_total:
            student.eval()
            h = evaluate_heldout(student, heldout, vocab)
            student.train()
            state["seconds"] += time.perf_counter() - t_run
            t_run = time.perf_counter()
            point = {"step": state["step"], "clips_seen": state["seen"], "distinct_clips": min(state["seen"], len(order)),
                     "loss": round(float(loss), 4), **{k: round(v, 4) for k, v in asdict(h).items()},
                     "cpu_seconds": round(state["seconds"], 1)}
            state["curve"].append(point)
            bar.set_postfix(loss=f"{float(loss):.3f}", agree=f"{h.agreement:.1%}", tpc=f"{h.tokens_per_call:.2f}")
            log(json.dumps(point))
            better = state["best"] is None or h.tokens_per_call > state["best"]["tokens_per_call"]
            if better:
                state["best"] = point
                _save_checkpoint(out / "best.pt", {"student": _trainable_state(student), "vocab": vocab})
            _save_checkpoint(ckpt, {"student": _trainable_state(student), "optim": optim.state_dict(), "state": state})
    bar.close()
    state["vocab_size"] = len(vocab)
    state["finished"] = state["step"] >= steps_total
    return state


def _trainable_state(student) -> dict:
    names = {id(p) for p in student.parameters() if p.requires_grad}
    return {k: v.detach().clone() for k, v in student.named_parameters() if id(v) in names}


# ----------------------------------------------------------------------------------------------------
# Export


def export(opts: DistillOptions, teacher: Teacher, state: dict, log) -> Path:
    """Write the assistant from the best checkpoint into ``out/assistant``."""
    import torch

    best = torch.load(opts.out / "train" / "best.pt", weights_only=False)
    student = make_student(teacher.model, opts.layers).float()
    student.load_state_dict(best["student"], strict=False)
    final = opts.out / "assistant"
    tmp = final.with_name(f"assistant.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    card = {
        "main": str(teacher.ref), "layers": opts.layers, "init_layers": student.config.distill_init_layers,
        "draft_vocab_size": len(best["vocab"]), "training": state.get("best"), "curve": state.get("curve"),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
    }
    if teacher.is_whisper:
        from safetensors.torch import save_file

        dec = student.model.decoder
        tensors = {f"layers.{k}": v.to(torch.bfloat16).contiguous() for k, v in dec.layers.state_dict().items()}
        tensors.update({f"layer_norm.{k}": v.to(torch.bfloat16).contiguous() for k, v in dec.layer_norm.state_dict().items()})
        save_file(tensors, tmp / "layers.safetensors")
        digest = hashlib.sha256((tmp / "layers.safetensors").read_bytes()).hexdigest()
        (tmp / "assistant.json").write_text(json.dumps({
            "base": teacher.ref.id, "layers": opts.layers, "init_layers": student.config.distill_init_layers,
            "draft_vocab": best["vocab"], "sha256": digest}, indent=1))
    else:
        student.config.draft_vocab = best["vocab"] if len(best["vocab"]) < student.config.vocab_size else None
        student.save_pretrained(tmp)
        teacher.tokenizer.save_pretrained(tmp)
    (tmp / "card.json").write_text(json.dumps(card, indent=1))
    (tmp / "CARD.md").write_text(card_text(card))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    log(f"assistant written to {final}")
    return final


def card_text(card: dict) -> str:
    best = card.get("training") or {}
    lines = [
        f"# Distilled assistant for {card['main']}", "",
        f"- decoder layers: {card['layers']} (initialised from the main model's layers {card['init_layers']})",
        "- encoder, token/position embeddings and output head: the main model's own (shared, frozen, not stored)",
        f"- draft vocabulary: {card['draft_vocab_size']} tokens (verification stays over the full vocabulary)",
        f"- data: {', '.join(card['options']['data'])}; {card['options']['clips']} training items, "
        f"{card['options']['heldout']} held out", 
        "- labels: the main model's own greedy output (Tandem's engine); loss CE + "
        f"{card['options']['kl_weight']} x KL to the teacher's top-{TOPK}",
        f"- best held-out point: {json.dumps(best)}", "", "## Learning curve (held-out)", "",
        "| step | clips seen | agreement | tokens per main call (k=5) | CPU s |", "|---|---|---|---|---|",
    ]
    for p in card.get("curve") or []:
        lines.append(f"| {p['step']} | {p['clips_seen']} | {p['agreement']:.1%} | {p['tokens_per_call']:.2f} | {p['cpu_seconds']} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------


def distill(opts: DistillOptions, log=print) -> Path | None:
    """Corpus -> labels -> training -> export, resumable. Returns the assistant folder, or None when the
    budget ran out before training finished (``--resume`` goes on)."""
    import torch

    if opts.threads:
        torch.set_num_threads(opts.threads)
    plan_path = opts.out / "plan.json"
    plan = {"main": opts.main, "layers": opts.layers, "data": list(opts.data), "seed": opts.seed,
            "shard_size": opts.shard_size, "heldout": opts.heldout}
    if plan_path.is_file():
        if not opts.resume:
            raise DistillError(f"{opts.out} holds an earlier run: pass --resume to go on, or choose another --out")
        if json.loads(plan_path.read_text()) != plan:
            raise DistillError(f"{opts.out} was made with other options ({plan_path}); choose another --out")
    opts.out.mkdir(parents=True, exist_ok=True)
    plan_path.write_text(json.dumps(plan, indent=1))
    deadline = time.time() + opts.budget_minutes * 60 if opts.budget_minutes else None
    ref = resolve_main(opts.main)
    # Whisper is labelled in bfloat16 (4x faster encoder here); text models and all training in float32
    teacher = Teacher(ref, "bfloat16" if _is_whisper_ref(ref) else "float32")
    done = build_corpus(opts, teacher, deadline, log)
    n_train = -(-opts.clips // opts.shard_size)
    if done < n_train:
        log(f"corpus: {done}/{n_train} shards labelled when the budget ran out; resume with --resume")
        return None
    if teacher.model.dtype != torch.float32:
        teacher = Teacher(ref, "float32")
    state = train(opts, teacher, list(range(1, n_train + 1)), deadline, log)
    if not state["finished"]:
        if (opts.out / "train" / "best.pt").is_file():
            export(opts, teacher, state, log)
        return None
    return export(opts, teacher, state, log)


def _is_whisper_ref(ref: ModelRef) -> bool:
    from .loading import load_config

    return load_config(ref).model_type == "whisper"

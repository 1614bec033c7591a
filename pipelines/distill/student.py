"""The student: a shallow decoder initialised from the main decoder's layers (the first and the
last, others spread between), token/position embeddings and head tied to the main model's and frozen, the
encoder the main model's own (frozen: its output is shared exactly). Loss per label position t:
    CE(teacher token_t) + w * sum_{i in top-8} p_T(i) * (log p_T(i) - log p_S(i))
where a Whisper student's p_S is a softmax over its draft vocabulary only (the tokens it may draft: the head's
rows for those tokens, about a fifth of the vocabulary, so a training step costs about half as much).
``training.train`` trains it (``StudentDesign``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from .options import DistillOptions, HeldOut
from .shards import Shard, shard_dir
from .teacher import Teacher, forced_logits


def spread_layers(total: int, n: int) -> list[int]:
    """n of total layers, the first and the last included, the rest evenly between."""
    if n >= total:
        return list(range(total))
    if n == 1:
        return [total - 1]
    return sorted({round(i * (total - 1) / (n - 1)) for i in range(n)})


def init_layers(total: int, n: int, init: str = "spread") -> list[int]:
    """The main decoder's layers a student starts from: ``spread`` (first, last, evenly between) or ``first``
    (the first n: the main model's own early exit, its head on its n-th layer)."""
    return list(range(min(n, total))) if init == "first" else spread_layers(total, n)


def make_student(main, n_layers: int, init: str = "spread"):
    """A shallow copy of the main model's decoder: ``n_layers`` of the main's (``init_layers``), embeddings and
    head shared (frozen); for Whisper a ``WhisperForCausalLM`` that reads the main encoder's output."""
    import copy

    import torch

    keep = init_layers(_decoder_layers(main), n_layers, init)
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


def decoder_macs(config, layers: int, head_rows: int, frames: int = 1500) -> int:
    """Multiply-adds of one decoded token through ``layers`` Whisper decoder layers and a head of ``head_rows``
    (batch 1, a short cache). Per layer: 4 d^2 (self-attention projections) + 2 d^2 (cross-attention query and
    output) + 2 d f (MLP, f its width) + 2 T d (cross-attention over T encoder frames); the head: rows x d."""
    d, f = config.d_model, config.decoder_ffn_dim
    return layers * (6 * d * d + 2 * d * f + 2 * frames * d) + head_rows * d


def draft_cost(config, layers: int, rows: int, frames: int = 1500) -> float:
    """Multiply-adds of one drafted token of a ``layers``-layer student with a ``rows``-token head relative to
    one main-model step (``decoder_macs``)."""
    return round(decoder_macs(config, layers, rows, frames) / decoder_macs(config, config.decoder_layers, config.vocab_size, frames), 3)


def draft_vocabulary(out: Path, shards: list[int], size: int, vocab: int, always: list[int]) -> list[int]:
    """The ``size`` most frequent label tokens of the training shards, plus ``always`` (special and timestamp
    tokens); sorted. size 0: the whole vocabulary."""
    return most_frequent((it["labels"] for s in shards for it in json.loads((shard_dir(out, s) / "items.json").read_text())),
                         size, vocab, always)


def most_frequent(labels, size: int, vocab: int, always: list[int]) -> list[int]:
    """The ``size`` most frequent tokens of ``labels`` (token id sequences), plus ``always``; sorted. size 0:
    the whole vocabulary (``labels`` left unread)."""
    if size <= 0:
        return list(range(vocab))
    counts: Counter = Counter()
    for y in labels:
        counts.update(y)
    return sorted({t for t, _ in counts.most_common(size)} | set(always))


def corpus_vocabulary(folder: Path, size: int, vocab: int, always: list[int]) -> list[int]:
    """``draft_vocabulary`` counted over every training label of the committed corpus in ``folder`` (shard 0,
    held out, left out), not only the run's shards: a student that goes on from an assistant (``--start``) on
    new shards keeps drafting the words of the clips it learnt before. CorpusError when a shard is damaged."""
    from .corpus import Corpus
    from .options import HELDOUT_SHARD

    corpus = Corpus(folder, json.loads((folder / "manifest.json").read_text())["teacher"], {})
    shards = [s for s in corpus.shards() if s != HELDOUT_SHARD]
    return most_frequent((clip.labels for s in shards for clip in corpus.read(s)), size, vocab, always)


def start_folder(start: str, ref) -> Path:
    """The exported assistant ``--start`` names: ``shipped`` (the one shipped for the embedded main model
    ``ref``, pipelines/assistants/) or a folder holding assistant.json and layers.safetensors (a ``tandem
    distill`` run's DIR/assistant, or DIR itself). DistillError when there is none."""
    from ..models.embedded import ASSISTANTS_DIR, DERIVED
    from .options import DistillError

    if start == "shipped":
        spec = next((d for d in DERIVED.values() if d.trained and f"embedded:{d.base}" == str(ref)), None)
        if spec is None:
            raise DistillError(f"--start shipped: no assistant is shipped for {ref}")
        return ASSISTANTS_DIR / spec.trained
    folder = Path(start)
    if (folder / "assistant" / "assistant.json").is_file():
        folder = folder / "assistant"
    return folder


def read_start(start: str, ref, layers: int) -> tuple[Path, dict]:
    """``start_folder``'s assistant and its assistant.json, checked (DistillError): distilled for ``ref``'s
    model with ``layers`` layers, its layers file the one its sha256 names."""
    from ..models.cache import file_sha256
    from .options import DistillError

    folder = start_folder(start, ref)
    try:
        meta = json.loads((folder / "assistant.json").read_text())
        digest = file_sha256(folder / "layers.safetensors")
    except (OSError, ValueError) as e:
        raise DistillError(f"--start {start}: not an exported Whisper assistant ({folder}: {e})") from None
    if meta.get("base") != ref.id or meta.get("layers") != layers:
        raise DistillError(f"--start {start}: distilled for {meta.get('base')!r} with {meta.get('layers')} layers, "
                           f"this run trains {layers} layers for {ref.id!r}")
    if digest != meta.get("sha256"):
        raise DistillError(f"--start {start}: {folder / 'layers.safetensors'} differs from the sha256 its assistant.json names")
    return folder, meta


def load_layers(student, folder: Path) -> None:
    """An exported assistant's decoder layers and final norm (``folder``/layers.safetensors) into ``student``
    (``make_student``'s, with as many layers), in the student's dtype."""
    from safetensors.torch import load_file

    dtype = next(student.parameters()).dtype
    tensors = {k: v.to(dtype) for k, v in load_file(folder / "layers.safetensors").items()}
    dec = student.model.decoder
    for part in ("layers", "layer_norm"):
        getattr(dec, part).load_state_dict({k[len(part) + 1 :]: v for k, v in tensors.items() if k.startswith(part + ".")})


# ----------------------------------------------------------------------------------------------------
# Training


def _batch(shards: dict[int, Shard], picks: list[tuple[int, int]], device: str = "cpu"):
    """Encoder outputs (B, T, d) float32 and mask on ``device``; prompts, labels and top-k targets per item."""
    import torch

    hid = [np.asarray(shards[s].enc[i], dtype=np.float32) for s, i in picks]
    mask = None
    if shards[picks[0][0]].mask is not None:
        width = max(h.shape[0] for h in hid)
        hid = [np.pad(h, ((0, width - h.shape[0]), (0, 0))) for h in hid]
        mask = torch.tensor(np.stack([np.pad(shards[s].mask[i], (0, width - shards[s].mask.shape[1]))
                                      for s, i in picks]), dtype=torch.long, device=device)
    prompts = [shards[s].items[i]["prompt"] for s, i in picks]
    labels = [shards[s].items[i]["labels"] for s, i in picks]
    tk_ids = [shards[s].topk_ids[shards[s].offsets[i] : shards[s].offsets[i] + len(labels[b])] for b, (s, i) in enumerate(picks)]
    tk_lp = [shards[s].topk_lp[shards[s].offsets[i] : shards[s].offsets[i] + len(labels[b])] for b, (s, i) in enumerate(picks)]
    return torch.from_numpy(np.stack(hid)).to(device), mask, prompts, labels, tk_ids, tk_lp


def draft_rows(student, vocab: list[int] | None):
    """The draft vocabulary as a LongTensor on the student's device, when its logits can be taken over it
    alone (Whisper students); None: the full vocabulary (text models, or ``vocab`` None)."""
    import torch

    if vocab is None or student.config.model_type != "whisper" or len(vocab) >= student.config.vocab_size:
        return None
    return torch.tensor(vocab, device=next(student.parameters()).device)


def distill_loss(student, batch, kl_weight: float, rows=None):
    """Mean over label positions of CE(teacher token) + kl_weight * KL(teacher top-k || student).
    With ``rows`` (the draft vocabulary) the student's softmax runs over those tokens only, as it drafts:
    positions whose teacher token lies outside are left out of the CE, top-k tokens outside out of the KL."""
    import torch

    hidden, mask, prompts, labels, tk_ids, tk_lp = batch
    device = hidden.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast_pays(device)):
        logits = forced_logits(student, hidden, mask, prompts, labels, grad=True, rows=rows)
    column = draft_columns(rows, student.config.vocab_size, device)
    total, count = 0.0, 0
    for b, (p, y) in enumerate(zip(prompts, labels)):
        lp = torch.log_softmax(logits[b, len(p) - 1 : len(p) - 1 + len(y)].float(), dim=-1)
        loss, n = ce_kl(lp, y, tk_ids[b], tk_lp[b], column, kl_weight)
        total, count = total + loss, count + n
    return total / max(count, 1)


def draft_columns(rows, vocab_size: int, device):
    """The column of each token id in logits over ``rows`` (-1: not drafted); None for the full vocabulary."""
    import torch

    if rows is None:
        return None
    column = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
    column[rows] = torch.arange(len(rows), device=device)
    return column


def ce_kl(lp, target: list[int], t_ids: np.ndarray, t_lp: np.ndarray, column, kl_weight: float):
    """Summed CE(target) + kl_weight * KL(teacher top-k || lp) over the rows of ``lp`` (n, columns), one row
    per target token; with ``column`` (``draft_columns``) rows whose target lies outside the draft vocabulary
    are left out, top-k tokens outside weigh 0. Returns (sum, rows counted)."""
    import torch

    device = lp.device
    target = torch.tensor(target, device=device)
    t_ids = torch.from_numpy(np.asarray(t_ids)).long().to(device)
    t_lp = torch.from_numpy(np.asarray(t_lp).astype(np.float32)).to(device)
    if column is not None:
        target, t_ids = column[target], column[t_ids]
        inside = target >= 0
        lp, target, t_lp, t_ids = lp[inside], target[inside], t_lp[inside], t_ids[inside]
    p_t = t_lp.exp() * (t_ids >= 0)  # a top-k token outside the draft vocabulary weighs 0
    ce = -lp.gather(1, target[:, None]).sum()
    kl = (p_t * (t_lp - lp.gather(1, t_ids.clamp(min=0)))).sum()
    return ce + kl_weight * kl, len(target)


def calls_for(n: int, hit, lookahead: int) -> int:
    """Main calls that emit ``n`` tokens when a call starting at token t accepts the drafts i = 0, 1, ... while
    ``hit(t, i)`` (the draft for token t + i agrees), at most ``lookahead``, then adds the main model's own
    token: each call emits (agreeing run) + 1 tokens."""
    t = calls = 0
    while t < n:
        run = 0
        while run < lookahead and t + run < n and hit(t, run):
            run += 1
        t += min(run + 1, n - t)
        calls += 1
    return calls


def evaluate_heldout(student, shard: Shard, vocab: list[int] | None, lookahead: int = 5) -> HeldOut:
    """Teacher-forced agreement and, from it, tokens per main call at a constant lookahead: drafts agree
    while the student's argmax (over the draft vocabulary) equals the teacher's token, so each main call
    yields (agreeing run, at most ``lookahead``) + 1 tokens."""
    import torch

    device = next(student.parameters()).device
    agree = total = calls = emitted = covered = 0
    keep = None if vocab is None else torch.tensor(vocab, device=device)
    rows = draft_rows(student, vocab)
    for g in range(0, len(shard.items), 16):
        picks = [(0, i) for i in range(g, min(g + 16, len(shard.items)))]
        hidden, mask, prompts, labels, _, _ = _batch({0: shard}, picks, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast_pays(device)):
            logits = forced_logits(student, hidden, mask, prompts, labels, rows=rows)
        for b, (p, y) in enumerate(zip(prompts, labels)):
            lg = logits[b, len(p) - 1 : len(p) - 1 + len(y)].float()
            if keep is None:
                pred = lg.argmax(-1)
            else:
                pred = keep[(lg if rows is not None else lg[:, keep]).argmax(-1)]
            target = torch.tensor(y, device=device)
            hits = (pred == target).tolist()
            agree += sum(hits)
            total += len(y)
            covered += len(y) if keep is None else int(torch.isin(target, keep).sum())
            calls += calls_for(len(y), lambda t, i: hits[t + i], lookahead)
            emitted += len(y)
    return HeldOut(agree / max(total, 1), emitted / max(calls, 1), covered / max(total, 1))


def autocast_pays(device) -> bool:
    """Whether training and held-out passes run under bfloat16 autocast on ``device`` (a torch.device): where
    bfloat16 is native (CUDA, a CPU with AMX or AVX-512 BF16); elsewhere it is emulated and a training step
    took over 90 s instead of about 1 (16 clips, an AVX2-only AMD EPYC), so they stay float32."""
    from ..devices import half_is_native

    return half_is_native(str(device), "bfloat16")


def _trainable_state(student) -> dict:
    names = {id(p) for p in student.parameters() if p.requires_grad}
    return {k: v.detach().clone() for k, v in student.named_parameters() if id(v) in names}


class StudentDesign:
    """A shallow student as ``training.train`` trains it (``training.Design``): its layers and final norm,
    the loss ``distill_loss`` over the draft vocabulary, measured by ``evaluate_heldout``."""

    kind = "student"

    def __init__(self, teacher: Teacher, opts: DistillOptions, vocab: list[int]) -> None:
        self.student = make_student(teacher.model, opts.layers, opts.init).float().to(teacher.device)
        if opts.start is not None:  # going on from an exported assistant: its layers, and where they came from
            folder, meta = read_start(opts.start, teacher.ref, opts.layers)
            load_layers(self.student, folder)
            self.student.config.distill_init_layers = list(meta["init_layers"])
        self.vocab, self.kl_weight, self.layers = vocab, opts.kl_weight, opts.layers
        self.init_layers = tuple(self.student.config.distill_init_layers)
        self.rows = draft_rows(self.student, vocab)  # the student's softmax over the tokens it may draft
        self.params = [p for p in self.student.parameters() if p.requires_grad]

    def loss(self, shards: dict[int, Shard], picks: list[tuple[int, int]]):
        device = next(self.student.parameters()).device
        return distill_loss(self.student, _batch(shards, picks, device), self.kl_weight, self.rows)

    def evaluate(self, shard: Shard) -> HeldOut:
        return evaluate_heldout(self.student, shard, self.vocab)

    def state(self) -> dict:
        return _trainable_state(self.student)

    def load(self, state: dict) -> None:
        self.student.load_state_dict(state, strict=False)

    def mode(self, training: bool) -> None:
        self.student.train(training)

    def cost(self, config) -> float:
        return draft_cost(config, self.layers, len(self.vocab))

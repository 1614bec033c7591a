"""Word-level timestamps, openai/whisper's method (``whisper/timing.py``), as post-processing of a window
whose tokens are decided: one extra pass of the main model's decoder over the window's text tokens reads
the cross-attention of the alignment heads, which dynamic time warping turns into a monotonic path from
tokens to 20 ms encoder frames; the path's jumps give each token's start, tokens are grouped into words
and punctuation merged into its word.

The pass reads only the final tokens and the window's encoder output, one window at a time (batch 1, the
same shapes whatever else was decoded beside it), so word times with the assistant equal those without it
whenever the tokens do, which the engine guarantees."""

from __future__ import annotations

import base64
import gzip
import string
from dataclasses import dataclass, replace

import numpy as np

from .options import Segment, Word

TIME_PER_FRAME = 0.02  # one encoder frame = two 10 ms mel frames (whisper's TOKENS_PER_SECOND = 50)
MEDIAN_WIDTH = 7  # whisper's medfilt_width
PREPEND_PUNCTUATIONS = "\"'“¿([{-"  # joined to the word after them (whisper's defaults)
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"  # joined to the word before them
UNSPACED_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}  # words split where tokens decode to whole characters
_SENTENCE_END = ".。!！?？"

# openai/whisper's published alignment heads (whisper/__init__.py _ALIGNMENT_HEADS): base85 of a gzipped
# boolean (decoder layers, heads) mask, by (decoder layers, heads, multilingual)
_OPENAI_HEADS = {
    (4, 6, False): b"ABzY8J1N>@0{>%R00Bk>$p{7v037`oCl~+#00",  # tiny.en
    (4, 6, True): b"ABzY8bu8Lr0{>%RKn9Fp%m@SkK7Kt=7ytkO",  # tiny
    (6, 8, False): b"ABzY8;40c<0{>%RzzG;p*o+Vo09|#PsxSZm00",  # base.en
    (6, 8, True): b"ABzY8KQ!870{>%RzyTQH3`Q^yNP!>##QT-<FaQ7m",  # base
}


@dataclass
class _Timing:
    """A word being formed (whisper's WordTiming): mutable while punctuation is merged."""

    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


def alignment_heads(model) -> list[tuple[int, int]]:
    """(layer, head) pairs whose cross-attention follows the speech: the generation config's
    ``alignment_heads``, else openai/whisper's published heads for the model's size, else (whisper's
    default) every head of the decoder's second half."""
    heads = getattr(model.generation_config, "alignment_heads", None)
    if heads:
        return [(int(layer), int(head)) for layer, head in heads]
    layers, n_heads = model.config.decoder_layers, model.config.decoder_attention_heads
    key = (layers, n_heads, bool(getattr(model.generation_config, "is_multilingual", False)))
    if key in _OPENAI_HEADS:
        mask = np.frombuffer(gzip.decompress(base64.b85decode(_OPENAI_HEADS[key])), dtype=bool)
        return [(int(a), int(b)) for a, b in np.argwhere(mask.reshape(layers, n_heads))]
    return [(layer, head) for layer in range(layers // 2, layers) for head in range(n_heads)]


def attention_pass(model, tokens: list[int], hidden, heads: list[tuple[int, int]], frames: int):
    """One decoder pass of ``model`` over ``tokens`` (batch 1) against one window's encoder output ``hidden``
    (frames, d_model). Returns the alignment heads' cross-attention logits q·kᵀ/√d over the first ``frames``
    encoder frames, float32 (heads, tokens, frames), and the pass's logits (tokens, vocabulary). The logits are
    those the attention module computes (its query and key projections), read by a hook on its inputs, so
    that any attention implementation serves."""
    import torch

    wanted = sorted({layer for layer, _ in heads})
    seen: dict[int, tuple] = {}
    layers = model.model.decoder.layers
    hooks = [layers[i].encoder_attn.register_forward_hook(
        lambda module, args, kwargs, out, i=i: seen.__setitem__(
            i, (module, args[0] if args else kwargs["hidden_states"], kwargs["key_value_states"])), with_kwargs=True)
        for i in wanted]
    try:
        with torch.inference_mode():
            ids = torch.tensor([tokens], device=hidden.device)
            out = model.model.decoder(input_ids=ids, encoder_hidden_states=hidden[None], use_cache=False)
            logits = model.proj_out(out.last_hidden_state)[0].float()
            scores = {}
            for i in wanted:
                module, h, kv = seen[i]
                d = module.head_dim
                q = (module.q_proj(h) * module.scaling).view(1, -1, module.num_heads, d).transpose(1, 2)
                k = module.k_proj(kv[:, :frames]).view(1, -1, module.num_heads, d).transpose(1, 2)
                scores[i] = (q.float() @ k.float().transpose(-1, -2))[0]  # (heads, tokens, frames)
            qk = torch.stack([scores[layer][head] for layer, head in heads])
    finally:
        for hook in hooks:
            hook.remove()
    return qk, logits


def median_filter(x, width: int = MEDIAN_WIDTH):
    """Median of each ``width`` neighbours along the last axis of a torch tensor, its ends padded by
    reflection (whisper's median_filter: the middle of the sorted window)."""
    import torch.nn.functional as F

    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    shape = x.shape
    y = F.pad(x.reshape(-1, 1, shape[-1]), (pad, pad), mode="reflect")
    return y.unfold(-1, width, 1).sort()[0][..., pad].reshape(shape)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic time warping (whisper's dtw_cpu and backtrace): the monotonic path from (0, 0) to
    (N-1, M-1) through ``cost`` (N, M) of least total cost, as (row indices, column indices).

    Total cost C[i, j] = x[i-1, j-1] + min(C[i-1, j-1] (0: diagonal), C[i-1, j] (1: down), C[i, j-1] (2:
    right)), ties going to right, then down: whisper's order. C is float32 as whisper's; cells of one
    anti-diagonal (i + j = d) depend only on the two before it, so each diagonal is one vector step."""
    n, m = cost.shape
    x = cost.astype(np.float64)
    total = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    total[0, 0] = 0
    for d in range(2, n + m + 1):
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        c0, c1, c2 = total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
        step = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        best = np.choose(step, [c0, c1, c2])
        total[i, j] = (x[i - 1, j - 1] + best).astype(np.float32)
        trace[i, j] = step
    return _backtrace(trace)


def _backtrace(trace: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The path DTW chose, read back from its last cell (whisper's backtrace; the first row can only go
    right and the first column only down)."""
    trace = trace.copy()
    trace[0, :], trace[:, 0] = 2, 1
    i, j = trace.shape[0] - 1, trace.shape[1] - 1
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        i, j = (i - 1, j - 1) if step == 0 else (i - 1, j) if step == 1 else (i, j - 1)
    rows, cols = np.array(path[::-1]).T
    return rows, cols


def token_path(qk, frames: int, skip: int) -> tuple[np.ndarray, np.ndarray]:
    """From the alignment heads' attention logits (heads, tokens, frames) to the DTW path over the tokens
    from ``skip`` on (the last, <|endoftext|>, left out), whisper's find_alignment:
    softmax over the window's frames; per head, z-score over tokens ((w - mean) / std); median filter
    along time; mean over heads; DTW on the negated matrix (the path of most attention)."""
    import torch

    weights = qk[:, :, :frames].softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    matrix = median_filter((weights - mean) / std).mean(dim=0)
    return dtw(-matrix[skip:-1].double().cpu().numpy())


def split_unicode(decode, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
    """Tokens cut wherever the text so far decodes to whole characters (no U+FFFD of a split one)."""
    full = decode(tokens)
    words, groups, current, offset = [], [], [], 0
    for token in tokens:
        current.append(token)
        text = decode(current)
        if "\ufffd" not in text or full[offset + text.index("\ufffd")] == "\ufffd":
            words.append(text)
            groups.append(current)
            current, offset = [], offset + len(text)
    return words, groups


def split_words(decode, tokens: list[int], language: str | None, eot: int) -> tuple[list[str], list[list[int]]]:
    """Whisper's split_to_word_tokens: for languages written without spaces, whole characters; else a new
    word at each piece that starts with a space, is punctuation or special (>= ``eot``)."""
    pieces, groups = split_unicode(decode, tokens)
    if language in UNSPACED_LANGUAGES:
        return pieces, groups
    words: list[str] = []
    word_tokens: list[list[int]] = []
    for piece, group in zip(pieces, groups):
        if group[0] >= eot or piece.startswith(" ") or piece.strip() in string.punctuation or not words:
            words.append(piece)
            word_tokens.append(list(group))
        else:
            words[-1] += piece
            word_tokens[-1].extend(group)
    return words, word_tokens


def merge_punctuations(words: list[_Timing], prepended: str, appended: str) -> None:
    """Whisper's merge_punctuations, in place: an opening mark (`` "``, ``(``...) joins the word after it,
    a closing one (``.``, ``,``...) the word before; the mark's own entry is left empty."""
    i, j = len(words) - 2, len(words) - 1
    while i >= 0:
        before, after = words[i], words[j]
        if before.word.startswith(" ") and before.word.strip() in prepended:
            after.word, after.tokens = before.word + after.word, before.tokens + after.tokens
            before.word, before.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(words):
        before, after = words[i], words[j]
        if not before.word.endswith(" ") and after.word in appended:
            before.word, before.tokens = before.word + after.word, before.tokens + after.tokens
            after.word, after.tokens = "", []
        else:
            i = j
        j += 1


def find_alignment(runner, hidden, sot_sequence: list[int], text_tokens: list[int], num_frames: int,
                   language: str | None) -> list[_Timing]:
    """Whisper's find_alignment: each word of ``text_tokens`` (one window's, timestamps left out) with its
    start and end (seconds from the window's start) and probability (mean of its tokens'). The pass reads
    ``sot_sequence`` <|notimestamps|> text <|endoftext|> against ``hidden``, the window's encoder output, over
    its first ``num_frames // 2`` encoder frames (``num_frames``: 10 ms mel frames of audio in the window)."""
    import torch

    if not text_tokens:
        return []
    model, tokenizer = runner.model, runner.tokenizer
    eot = model.generation_config.eos_token_id
    tokens = [*sot_sequence, model.generation_config.no_timestamps_token_id, *text_tokens, eot]
    frames = num_frames // 2
    qk, logits = attention_pass(model, tokens, hidden, alignment_heads(model), frames)
    skip = len(sot_sequence)  # the path starts at <|notimestamps|>: token k starts where row k begins
    probs = logits[skip:, :eot].softmax(dim=-1)
    text_probs = probs[torch.arange(len(text_tokens)), torch.tensor(text_tokens)].tolist()
    rows, cols = token_path(qk, frames, skip)

    def decode(ids: list[int]) -> str:
        return tokenizer.convert_tokens_to_string(tokenizer.convert_ids_to_tokens(ids))

    words, groups = split_words(decode, text_tokens + [eot], language, eot)
    if len(groups) <= 1:
        return []
    bounds = np.pad(np.cumsum([len(g) for g in groups[:-1]]), (1, 0))
    jumps = np.pad(np.diff(rows), (1, 0), constant_values=1).astype(bool)  # first frame of each row of the path
    jump_times = cols[jumps] / (1 / TIME_PER_FRAME)
    return [_Timing(word, group, float(jump_times[a]), float(jump_times[b]), float(np.mean(text_probs[a:b])))
            for word, group, a, b in zip(words, groups, bounds[:-1], bounds[1:])]


def _trim_sentence_ends(timings: list[_Timing], max_duration: float) -> None:
    """Whisper's first heuristic: a sentence-ending mark, or the word after one, is at most ``max_duration``."""
    for i in range(1, len(timings)):
        if timings[i].end - timings[i].start > max_duration:
            if timings[i].word in _SENTENCE_END:
                timings[i].end = timings[i].start + max_duration
            elif timings[i - 1].word in _SENTENCE_END:
                timings[i].start = timings[i].end - max_duration


def _fit_segment(seg: Segment, words: list[dict], median: float, last_speech: float) -> Segment:
    """Whisper's boundary heuristics for one segment's ``words`` (changed in place): the first word (and
    second) after a pause no longer than twice the median word; a first or last word running more than
    0.5 s past the segment's own timestamp cut back to it; else the segment takes its words' extent."""
    longest = median * 2
    first, last = words[0], words[-1]
    if first["end"] - last_speech > median * 4 and (
            first["end"] - first["start"] > longest or (len(words) > 1 and words[1]["end"] - first["start"] > longest * 2)):
        if len(words) > 1 and words[1]["end"] - words[1]["start"] > longest:
            boundary = max(words[1]["end"] / 2, words[1]["end"] - longest)
            first["end"] = words[1]["start"] = boundary
        first["start"] = max(0, first["end"] - longest)
    start, end = seg.start, seg.end
    if start < first["end"] and start - 0.5 > first["start"]:
        first["start"] = max(0, min(first["end"] - median, start))
    else:
        start = first["start"]
    if end > last["start"] and end + 0.5 < last["end"]:
        last["end"] = max(last["start"] + median, end)
    else:
        end = last["end"]
    return replace(seg, start=start, end=end, words=tuple(Word(**w) for w in words))


def add_word_timestamps(runner, hidden, sot_sequence: list[int], pieces: list[tuple[Segment | None, list[int]]],
                        num_frames: int, offset: float, language: str | None, last_speech: float,
                        prepend: str = PREPEND_PUNCTUATIONS, append: str = APPEND_PUNCTUATIONS) -> tuple[list[Segment], float]:
    """Whisper's add_word_timestamps for one window: ``pieces`` are its segments in order, each (the
    Segment, or None for one without text, and its text tokens); ``offset`` is the window's start in
    seconds, ``last_speech`` the end of the file's last word before it. Returns the segments with their
    ``words`` (and bounds moved to them) and the new ``last_speech``."""
    timings = find_alignment(runner, hidden, sot_sequence, [t for _, toks in pieces for t in toks], num_frames, language)
    durations = np.array([t.end - t.start for t in timings])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    if len(durations):
        _trim_sentence_ends(timings, median * 2)
    merge_punctuations(timings, prepend, append)
    out, index, last_word_end = [], 0, None
    for seg, toks in pieces:
        saved, words = 0, []
        while index < len(timings) and saved < len(toks):
            t = timings[index]
            if t.word:
                words.append(dict(start=round(offset + t.start, 2), end=round(offset + t.end, 2), word=t.word,
                                  probability=t.probability))
            saved += len(t.tokens)
            index += 1
        if seg is None:
            continue
        if words:
            seg = _fit_segment(seg, words, median, last_speech)
            last_speech, last_word_end = seg.end, seg.words[-1].end
        out.append(seg)
    return out, last_speech if last_word_end is None else last_word_end


def seek_after_words(segments: list[Segment], tokens: list[int], timestamp_begin: int, offset: float,
                     advance: float) -> float:
    """Whisper's seek with word timestamps: unless the window's ``tokens`` end with a single timestamp
    (nothing said after it: the whole window is consumed, ``advance``), the next window starts where the
    last word of ``segments`` ends, when that is past the window's start ``offset``, not at the last
    timestamp. Seconds from ``offset``."""
    single_ending = len(tokens) >= 2 and tokens[-1] >= timestamp_begin > tokens[-2]
    ends = [w.end for seg in segments for w in seg.words]
    if single_ending or not ends or ends[-1] <= offset:
        return advance
    return ends[-1] - offset

"""Word timestamps against openai-whisper itself (issue 52): the embedded Whisper weights converted into an
openai-whisper model, whisper's own code run on the same audio, and Tandem's words compared with its word by
word, in three layers that separate the causes of a gap:

- ``method``: whisper's ``add_word_timestamps`` on every window Tandem decoded (the same tokens, window start
  and previous-speech time), fed Tandem's log-mel features of the window: what is left is the method itself
  (and the float rounding of two implementations of one model);
- ``mel``: the same windows fed whisper's own log-mel (``log_mel_spectrogram`` of the whole file, sliced and
  padded as its ``transcribe`` does), which Tandem's features (``asr.features``) reproduce: what is left is
  the features' rounding;
- ``transcribe``: ``whisper.transcribe(word_timestamps=True)`` with Tandem's decoding options, compared on the
  segments both decoded to the same text: adds whisper's own decoding (its sampled fallbacks, its 224-token
  window) and where its windows start.

openai-whisper is not a dependency (its package pulls triton): ``pip install --no-deps openai-whisper==20250625
tiktoken numba``. Run: ``python -m pipelines.quality.words_reference --set speech-real``."""

from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from ..asr.options import Segment, TranscribeOptions
from ..audio import SAMPLE_RATE, load_audio

FINE_S, COARSE_S = 0.02, 0.1  # issue 52's bars: 95% of words within FINE_S, all within COARSE_S
_EPS = 1e-6  # times are rounded to 0.01 s on both sides: a difference of 0.02 may read 0.0200000001
LAYERS = ("method", "mel", "transcribe")

# transformers' Whisper names -> openai-whisper's, in order (the reverse of transformers'
# convert_openai_to_hf.py); "model." is dropped first, the layer norms before the attentions they name
_RENAMES = (
    ("encoder.embed_positions.weight", "encoder.positional_embedding"),
    ("decoder.embed_positions.weight", "decoder.positional_embedding"),
    ("decoder.embed_tokens", "decoder.token_embedding"),
    ("encoder.layer_norm", "encoder.ln_post"),
    ("decoder.layer_norm", "decoder.ln"),
    (".layers.", ".blocks."),
    ("self_attn_layer_norm", "attn_ln"),
    ("encoder_attn_layer_norm", "cross_attn_ln"),
    ("final_layer_norm", "mlp_ln"),
    ("self_attn.", "attn."),
    ("encoder_attn.", "cross_attn."),
    ("q_proj", "query"),
    ("k_proj", "key"),
    ("v_proj", "value"),
    ("out_proj", "out"),
    ("fc1", "mlp.0"),
    ("fc2", "mlp.2"),
)


def openai_state(hf_state: dict) -> dict:
    """A transformers Whisper state dict under openai-whisper's names; ``proj_out`` (tied to the token
    embedding, which whisper reuses as its output projection) left out."""
    out = {}
    for name, tensor in hf_state.items():
        if name.startswith("proj_out"):
            continue
        name = name.removeprefix("model.")
        for old, new in _RENAMES:
            name = name.replace(old, new)
        out[name] = tensor
    return out


def openai_dims(config) -> dict:
    """openai-whisper's ModelDimensions from a transformers WhisperConfig. Raises ValueError for a config whisper
    cannot hold (its feed-forward layers are 4 x d_model wide)."""
    if {config.encoder_ffn_dim, config.decoder_ffn_dim} != {4 * config.d_model}:
        raise ValueError(f"whisper's feed-forward layers are 4 x d_model = {4 * config.d_model} wide, not "
                         f"{config.encoder_ffn_dim} / {config.decoder_ffn_dim}")
    return dict(n_mels=config.num_mel_bins, n_audio_ctx=config.max_source_positions, n_audio_state=config.d_model,
                n_audio_head=config.encoder_attention_heads, n_audio_layer=config.encoder_layers,
                n_vocab=config.vocab_size, n_text_ctx=config.max_target_positions, n_text_state=config.d_model,
                n_text_head=config.decoder_attention_heads, n_text_layer=config.decoder_layers)


def whisper_model(hf_model):
    """An openai-whisper ``Whisper`` (float32, eval) with ``hf_model``'s weights and the alignment heads Tandem
    uses for it (``words.alignment_heads``). Raises ImportError without openai-whisper."""
    import torch
    from whisper.model import ModelDimensions, Whisper

    from ..asr.words import alignment_heads

    model = Whisper(ModelDimensions(**openai_dims(hf_model.config)))
    model.load_state_dict(openai_state({k: v.float() for k, v in hf_model.state_dict().items()}))
    mask = torch.zeros(model.dims.n_text_layer, model.dims.n_text_head, dtype=torch.bool)
    for layer, head in alignment_heads(hf_model):
        mask[layer, head] = True
    model.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)
    return model.eval()


@dataclass
class Window:
    """One window Tandem timed words for: its start (seconds), 10 ms mel frames of audio, the pieces between
    its timestamps (words.add_word_timestamps' input), the file's last speech before it, and Tandem's result."""

    offset: float
    num_frames: int
    sot: list[int]
    pieces: list[tuple[Segment | None, list[int]]]
    last_speech: float
    segments: list[Segment]


@contextmanager
def recording_windows(windows: list[Window]) -> Iterator[None]:
    """While open, every window that ``asr.batching`` times words for is appended to ``windows``."""
    from ..asr import batching

    original = batching.add_word_timestamps

    def record(runner, hidden, sot, pieces, num_frames, offset, language, last_speech, *rest):
        segs, after = original(runner, hidden, sot, pieces, num_frames, offset, language, last_speech, *rest)
        windows.append(Window(offset, num_frames, list(sot), list(pieces), last_speech, list(segs)))
        return segs, after

    batching.add_word_timestamps = record
    try:
        yield
    finally:
        batching.add_word_timestamps = original


@dataclass
class Gaps:
    """Tandem's words against the reference's, over segments of the same text (words paired in order)."""

    words: int = 0  # word pairs compared
    same_words: int = 0  # of them, the same word (punctuation included)
    within_fine: int = 0  # start and end both within FINE_S
    within_coarse: int = 0  # both within COARSE_S
    max_gap: float = 0.0  # the largest start or end difference, seconds
    segments: int = 0  # segments compared: the same text on both sides
    segments_total: int = 0  # segments Tandem gave
    worst: list = field(default_factory=list)  # (gap, word, Tandem's start-end, the reference's), largest first

    def add(self, ours: list[tuple[str, float, float]], theirs: list[tuple[str, float, float]]) -> None:
        """One segment's words on both sides, each (word, start, end)."""
        self.segments += 1
        for (w, s, e), (w2, s2, e2) in zip(ours, theirs):
            gap = float(max(abs(s - s2), abs(e - e2)))
            self.words += 1
            self.same_words += int(w == w2)
            self.within_fine += int(gap <= FINE_S + _EPS)
            self.within_coarse += int(gap <= COARSE_S + _EPS)
            self.max_gap = max(self.max_gap, round(gap, 2))
            if gap > FINE_S + _EPS:
                self.worst.append((round(gap, 2), w, f"{s:.2f}-{e:.2f}", f"{s2:.2f}-{e2:.2f}"))
        self.worst = sorted(self.worst, reverse=True)[:10]

    def merge(self, other: Gaps) -> None:
        for name in ("words", "same_words", "within_fine", "within_coarse", "segments", "segments_total"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_gap = max(self.max_gap, other.max_gap)
        self.worst = sorted(self.worst + other.worst, reverse=True)[:10]

    def line(self) -> str:
        """The figures in one line: words (same), % within 0.02 s and 0.1 s, max, segments compared."""
        n = max(1, self.words)
        return (f"{self.words} words ({self.same_words} same), {100 * self.within_fine / n:.1f}% within {FINE_S} s, "
                f"{100 * self.within_coarse / n:.1f}% within {COARSE_S} s, max {self.max_gap:.2f} s; "
                f"{self.segments} of {self.segments_total} segments compared")


def _ours(seg: Segment) -> list[tuple[str, float, float]]:
    return [(w.word, w.start, w.end) for w in seg.words]


def _theirs(words: list[dict]) -> list[tuple[str, float, float]]:
    return [(w["word"], w["start"], w["end"]) for w in words]


def replay_window(model, tokenizer, window: Window, mel, options: TranscribeOptions) -> Gaps:
    """whisper's ``add_word_timestamps`` on one of Tandem's windows (``mel``: (mels, 3000) log-mel features),
    compared with Tandem's words for it."""
    from whisper.timing import add_word_timestamps

    if tokenizer.sot_sequence != tuple(window.sot):
        raise ValueError(f"window prompts differ: whisper {tokenizer.sot_sequence}, Tandem {window.sot}")
    seek = round(window.offset * SAMPLE_RATE / 160)  # whisper's seek counts 10 ms mel frames
    segments = [dict(seek=seek, start=seg.start if seg else window.offset, end=seg.end if seg else window.offset,
                     tokens=list(tokens)) for seg, tokens in window.pieces]
    add_word_timestamps(segments=segments, model=model, tokenizer=tokenizer, mel=mel, num_frames=window.num_frames,
                        last_speech_timestamp=window.last_speech, prepend_punctuations=options.prepend_punctuations,
                        append_punctuations=options.append_punctuations)
    theirs = [s["words"] for s, (seg, _) in zip(segments, window.pieces) if seg is not None]
    gaps = Gaps(segments_total=len(window.segments))
    for seg, words in zip(window.segments, theirs):
        gaps.add(_ours(seg), _theirs(words))
    return gaps


def compare_transcripts(ours: list[Segment], theirs: list[dict]) -> Gaps:
    """Tandem's segments against ``whisper.transcribe``'s, those of the same text paired in order (a longest
    common subsequence of the segment texts); segments whisper emptied (instantaneous or without text) skipped."""
    theirs = [s for s in theirs if s["text"].strip()]
    a, b = [s.text.strip() for s in ours], [s["text"].strip() for s in theirs]
    gaps = Gaps(segments_total=len(ours))
    for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            gaps.add(_ours(ours[block.a + k]), _theirs(theirs[block.b + k]["words"]))
    return gaps


def compare_file(path: str, runner, model, options: TranscribeOptions, layers=LAYERS) -> dict[str, Gaps]:
    """Tandem (``runner``'s pair, ``options`` with word timestamps) and openai-whisper (``model``) on one file:
    the Gaps of each of ``layers``."""
    import torch
    import whisper
    from whisper.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
    from whisper.tokenizer import get_tokenizer

    from ..asr import transcribe
    from ..asr.features import file_span

    windows: list[Window] = []
    with recording_windows(windows):
        [transcript] = transcribe([path], runner.pair, options, runner=runner)
    if transcript.error:
        raise RuntimeError(f"{path}: {transcript.error}")
    audio = load_audio(path)
    language = options.language or transcript.language or "en"
    tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages, language=language,
                              task=options.task)
    out: dict[str, Gaps] = {}
    with torch.no_grad():
        if "method" in layers:
            out["method"] = Gaps()
            ceiling = runner.loudest_frame([audio])
            for w in windows:
                span = file_span(audio, round(w.offset * SAMPLE_RATE), ceiling=ceiling)
                mel = runner.feats([span])[0].float()  # the features Tandem decoded the window from
                out["method"].merge(replay_window(model, tokenizer, w, mel, options))
        if "mel" in layers:
            out["mel"] = Gaps()
            full = log_mel_spectrogram(audio, model.dims.n_mels, padding=N_SAMPLES)
            for w in windows:
                seek = round(w.offset * SAMPLE_RATE / 160)
                mel = pad_or_trim(full[:, seek:seek + min(N_FRAMES, w.num_frames)], N_FRAMES)
                out["mel"].merge(replay_window(model, tokenizer, w, mel, options))
        if "transcribe" in layers:
            torch.manual_seed(0)  # its sampled fallbacks
            result = whisper.transcribe(
                model, audio, verbose=None, language=language, task=options.task, temperature=options.temperature,
                compression_ratio_threshold=options.compression_ratio_threshold,
                logprob_threshold=options.logprob_threshold, no_speech_threshold=options.no_speech_threshold,
                condition_on_previous_text=options.condition_on_previous_text, initial_prompt=options.initial_prompt,
                word_timestamps=True, prepend_punctuations=options.prepend_punctuations,
                append_punctuations=options.append_punctuations, beam_size=options.beam_size, fp16=False)
            out["transcribe"] = compare_transcripts(list(transcript.segments), result["segments"])
    return out


def main(argv: list[str] | None = None) -> dict:
    """``python -m pipelines.quality.words_reference``: the comparison on a set's files, a line per file and
    layer, then the totals; ``--json`` writes them."""
    from ..asr import WhisperRunner
    from ..models.registry import load_registry
    from .sets import build_set, read_manifest

    p = argparse.ArgumentParser(prog="python -m pipelines.quality.words_reference", description=__doc__.split("\n\n")[0])
    p.add_argument("--set", default="speech-real", help="a speech set (tandem data build builds it)")
    p.add_argument("--items", help="comma-separated item ids of the set (default: all)")
    p.add_argument("--model", help="the pair (default: the registry's asr default)")
    p.add_argument("--layers", default=",".join(LAYERS), help=f"comma-separated, of {', '.join(LAYERS)}")
    p.add_argument("--no-assistant", action="store_true", help="Tandem decodes plainly")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    layers = tuple(x for x in args.layers.split(",") if x)
    registry = load_registry()
    pair = registry.get(args.model) if args.model else registry.default("asr")
    build_set(args.set)
    items = read_manifest(args.set)
    if args.items:
        wanted = args.items.split(",")
        items = [i for i in items if i["id"] in wanted]
    runner = WhisperRunner(pair)
    model = whisper_model(runner.model)
    options = TranscribeOptions(word_timestamps=True, batch_size=1, use_assistant=not args.no_assistant,
                                language=items[0].get("language", "en") if items else "en")
    totals = {layer: Gaps() for layer in layers}
    files = {}
    for item in items:
        gaps = compare_file(item["audio_path"], runner, model, options, layers)
        files[item["id"]] = {layer: asdict(g) for layer, g in gaps.items()}
        for layer, g in gaps.items():
            totals[layer].merge(g)
            print(f"{item['id']} {layer}: {g.line()}", flush=True)
    for layer, g in totals.items():
        print(f"TOTAL {layer}: {g.line()}")
        for worst in g.worst:
            print(f"    {worst}")
    report = {"set": args.set, "pair": pair.name, "files": files, "totals": {k: asdict(g) for k, g in totals.items()}}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()

"""The argument types and the options several ``tandem`` commands share, so that one option name means one
thing everywhere and each default is said in ``--help`` the same way (``HelpFormatter``).

The primary spellings are the ecosystem's (openai/whisper's ``--model``, ``--output_dir``/``--output-dir``
and ``--output_format``; vLLM's ``--model``); Tandem's older spellings (``--pair``, ``--out``, ``--formats``,
``--json``) keep working as aliases of the same option.
"""

from __future__ import annotations

import argparse
from typing import Callable, TypeVar

T = TypeVar("T")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, less the defaults that say nothing: an option whose default is None or
    False (a flag, or a default decided later, which its help then explains) gets no "(default: ...)"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or "%(default)" in (action.help or "") or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def argument_type(parse: Callable[[str], T], expected: str | None = None,
                  errors: tuple[type[Exception], ...] = (ValueError,)) -> Callable[[str], T]:
    """An argparse type from ``parse``: one of its ``errors`` becomes an argument error saying ``<expected>, not
    '<text>'`` (``expected`` None: the error's own message), which argparse prints after the option's name."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except errors as err:
            raise argparse.ArgumentTypeError(str(err) if expected is None else f"{expected}, not {text!r}") from None

    return convert


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` (to ``high``), else an argument error saying the range."""

    def in_range(text: str) -> int:
        value = int(text)
        if value < low or high is not None and value > high:
            raise ValueError(text)
        return value

    return argument_type(in_range, f"expected a whole number from {low}" + (f" to {high}" if high is not None else ""))


count = whole_number(1)  # a count (items, repeats, rows, tokens, threads, a batch)
port = whole_number(1, 65535)  # a TCP port


def _above_zero(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):  # nan fails too
        raise ValueError(text)
    return value


positive = argument_type(_above_zero, "expected a number above 0")  # epochs, a learning rate, minutes
# a threshold: a number, or 'off' (None: the check is off)
threshold = argument_type(lambda text: None if text.lower() in ("off", "none") else float(text),
                          "expected a number or 'off'")
# Whisper's fallback schedule, comma-separated temperatures: ``0,0.2,0.4``
temperatures = argument_type(lambda text: tuple(float(t) for t in text.split(",") if t.strip()),
                             "expected comma-separated numbers")


DTYPES = ("float32", "bfloat16", "float16")
LOOKAHEAD_HELP = ("drafts per round: adaptive, constant:N, heuristic:N, confidence, random:SEED (a seeded random "
                  "schedule, to check that outputs do not depend on it)")
DEVICE_HELP = ("where the models run: auto (a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N "
               "(default: $TANDEM_DEVICE, else auto); on CUDA the dtype defaults to bfloat16 (float16 where "
               "bfloat16 is not supported)")
DEVICE_PARENT = argparse.ArgumentParser(add_help=False)
DEVICE_PARENT.add_argument("--device", metavar="DEVICE", default=argparse.SUPPRESS, help=DEVICE_HELP)


def add_command(subparsers, name: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand with the shared help formatter; it takes --device after its name too (tandem transcribe
    --device cuda = tandem --device cuda transcribe; given after the name, it wins)."""
    return subparsers.add_parser(name, parents=[DEVICE_PARENT], formatter_class=HelpFormatter, **kwargs)


def add_alias(parser: argparse.ArgumentParser, *names: str, dest: str, **kwargs) -> None:
    """Older or other spellings of an option, kept working but left out of ``--help`` (the option they stand
    for is listed under its primary name)."""
    parser.add_argument(*names, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def add_model(parser: argparse.ArgumentParser, what: str, *, required: bool = False,
              default: str | None = None) -> None:
    """``-m/--model NAME`` (alias ``--pair``): a pair from the registry (``models.yaml``), into ``args.pair``."""
    parser.add_argument("-m", "--model", "--pair", dest="pair", metavar="NAME", required=required, default=default,
                        help=what)


WEIGHT_DTYPE_HELP = ("dtype (default: the pair's, bfloat16 for the embedded Qwen pairs); int8 / int4: the main "
                     "model's weights quantized (int4 in groups of 32) on torch's kernels, products in bfloat16 where "
                     "the CPU has it natively, else float32; q4_k_m: the main model is the pair's GGUF file itself on "
                     "llama.cpp's kernels, the fastest here (docs/benchmarks.md), not the "
                     "default because it needs the 'gguf' extra, which compiles llama.cpp; each reads fewer bytes a "
                     "step than bfloat16, assisted output still equal to plain in that dtype; a CPU only (docs/text.md)")


WHISPER_DTYPE_HELP = ("dtype (default: the pair's); int8 / int4: the decoders' linear layers quantized (int4 in "
                      "groups of 32) on torch's kernels, products in bfloat16 where the CPU has it natively, else "
                      "float32, the encoder and the head in that dtype; assisted output still equal to plain in that "
                      "dtype; a CPU only; not a default: not faster than bfloat16 as measured (docs/benchmarks.md)")


def add_dtype(parser: argparse.ArgumentParser, what: str = "compute dtype (default: the pair's)",
              weights: tuple[str, ...] = ()) -> None:
    """``--dtype`` with the dtypes the engine offers, and the weight-only ``weights`` (``devices.WEIGHT_DTYPES``:
    the text pairs' int8, int4 and q4_k_m; ``TORCH_WEIGHT_DTYPES``: int8 and int4, Whisper's too, with
    ``WHISPER_DTYPE_HELP``)."""
    parser.add_argument("--dtype", choices=DTYPES + weights, help=what)


def add_report(parser: argparse.ArgumentParser, default: str | None, what: str = "write the figures (JSON) here") -> None:
    """``--report FILE`` (alias ``--json FILE``): where a benchmark or evaluation writes its JSON, into
    ``args.json``. (``--json`` in ``gh`` and ``llm`` picks an output format; here it is an old spelling.)"""
    parser.add_argument("--report", dest="json", metavar="FILE", default=default, help=what)
    add_alias(parser, "--json", dest="json", metavar="FILE")


def add_lookahead(parser: argparse.ArgumentParser) -> None:
    """``--lookahead POLICY[:N]``: the draft schedule (``engine.parse_policy`` reads it)."""
    parser.add_argument("--lookahead", default="adaptive", metavar="POLICY[:N]", help=LOOKAHEAD_HELP)


def add_words(parser: argparse.ArgumentParser) -> None:
    """Word-level timestamps and the subtitle layout from words, with openai/whisper's names and defaults."""
    parser.add_argument("--word-timestamps", action="store_true",
                        help="each word's start, end and probability (whisper's method: cross-attention aligned "
                             "by DTW; identical with the assistant): json 'words', srt/vtt cues from words")
    parser.add_argument("--prepend-punctuations", default="\"'“¿([{-", metavar="CHARS",
                        help="with --word-timestamps: marks joined to the word after them")
    parser.add_argument("--append-punctuations", default="\"'.。,，!！?？:：”)]}、", metavar="CHARS",
                        help="with --word-timestamps: marks joined to the word before them")
    parser.add_argument("--highlight-words", action="store_true",
                        help="srt/vtt: underline each word as it is spoken (needs --word-timestamps)")
    parser.add_argument("--max-line-width", type=whole_number(1), metavar="N",
                        help="srt/vtt: characters in a line before it breaks (needs --word-timestamps)")
    parser.add_argument("--max-line-count", type=whole_number(1), metavar="N",
                        help="srt/vtt: lines in a cue (needs --max-line-width)")
    parser.add_argument("--max-words-per-line", type=whole_number(1), metavar="N",
                        help="srt/vtt: words in a line (needs --word-timestamps; no effect with --max-line-width)")


def add_search(parser: argparse.ArgumentParser) -> None:
    """Beam search at temperature 0 and best-of at the fallback temperatures, openai/whisper's names and semantics
    (``TranscribeOptions`` checks their combinations: one line before any weights load)."""
    parser.add_argument("--beam-size", type=whole_number(1), metavar="N",
                        help="beam search at temperature 0 with N beams a window (whisper's; exact with the assistant). "
                             "Default: greedy (whisper's is 5): on 3 speech-real clips beam 5 gave greedy's text at 3.6x "
                             "its CPU time, and the assistant's drafts do not win that back")
    parser.add_argument("--patience", type=positive, metavar="X",
                        help="with --beam-size: a window ends once round(N x X) texts ended (default 1.0)")
    parser.add_argument("--length-penalty", type=float, metavar="A",
                        help="rank beams or samples by sum_logprob / ((5 + length) / 6) ** A, A from 0 to 1 "
                             "(default: sum_logprob / length, whisper's)")
    parser.add_argument("--best-of", type=whole_number(1), metavar="N",
                        help="at each fallback temperature above 0: N samples a window, the best kept by that ranking "
                             "(whisper's; default 1)")


def add_prompts(p: argparse.ArgumentParser) -> None:
    """Text prompts before a window and the first window's prefix, with openai/whisper's and faster-whisper's
    names (asr/prompts.py)."""
    p.add_argument("--initial-prompt", metavar="TEXT", help="text the model reads before the first window, as if "
                   "said before it: names and terms spelled as you want them, a style of punctuation")
    p.add_argument("--hotwords", metavar="TEXT", help="text read before every window (faster-whisper's hotwords): "
                   "rare names and terms, spelled as the transcript should spell them")
    p.add_argument("--prefix", metavar="TEXT", help="text the first window's transcript starts with, the model "
                   "going on from it (faster-whisper's prefix: part of the transcript, as there; openai/whisper's "
                   "decode leaves it out of its text)")
    p.add_argument("--condition-on-previous-text", action=argparse.BooleanOptionalAction, default=False,
                   help="each window of a long file also reads the file's text so far; sequential long-form "
                        "only. Off by default (whisper's is on): on speech-long it moved WER from 4.33%% to 4.24%% "
                        "but the assistant, trained without prompts, drafted 1.64 tokens per main call instead of "
                        "2.96, and decoding took 1.76x as long (docs/transcription.md)")
    p.add_argument("--prompt-reset-on-temperature", type=float, default=0.5, metavar="T",
                   help="with --condition-on-previous-text: a window kept at a fallback temperature above T "
                        "starts the previous text anew")


WHISPER_SPELLINGS = (  # openai/whisper's command line spells these with underscores (the others as Tandem does)
    "--initial-prompt", "--condition-on-previous-text", "--prompt-reset-on-temperature", "--beam-size", "--best-of",
    "--length-penalty", "--compression-ratio-threshold", "--logprob-threshold", "--no-speech-threshold",
    "--word-timestamps", "--prepend-punctuations", "--append-punctuations", "--highlight-words", "--max-line-width",
    "--max-line-count", "--max-words-per-line",
)


# an on/off option's value in openai/whisper's spelling (``--word_timestamps True``): True or False, any case
flag_value = argument_type(lambda text: {"true": True, "false": False}[text.lower()], "expected True or False",
                           errors=(KeyError,))


def add_whisper_spellings(parser: argparse.ArgumentParser) -> None:
    """openai/whisper's underscore spellings of ``WHISPER_SPELLINGS`` (``--beam_size 5``), as aliases left out of
    ``--help``: a valued option takes the same values; an on/off one takes whisper's ``True``/``False`` after it
    (bare, it turns the option on). Call after the options are added."""
    for name in WHISPER_SPELLINGS:
        action = parser._option_string_actions[name]  # (argparse's table of option strings)
        alias = "--" + name[2:].replace("-", "_")
        if action.nargs == 0:  # a flag: store_true or --x/--no-x
            add_alias(parser, alias, dest=action.dest, nargs="?", const=True, type=flag_value, metavar="BOOL")
        else:
            add_alias(parser, alias, dest=action.dest, type=action.type, choices=action.choices, metavar=action.metavar)


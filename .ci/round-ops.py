"""Host operations a round, counted on a CPU with the CUDA path's choices (issue 14): every aten operation
the engine dispatches outside a graph's body, each a kernel launch or host work on a GPU, where a round of
Whisper base with the shipped assistant should cost little more than its graphs' replays.

The CUDA path's choices on a CPU: the main decoder's passes 8 columns wide (``whisper.CUDA_SHAPE``), the
static caches and graphs run eagerly (``graphs = "eager"``: the same buffers and steps, nothing captured),
row copies by index (``rows.indexed``), the assistant in float32 without int8 (its kernels are CPU ones).
A graph's body is not counted (``graphs.PassGraph.__call__`` pauses the count while it runs); the copies
into its inputs are. The first N speech-real files (default 4), one at a time, greedy, ``--lookahead``
(default constant:3), after one warm pass, with the logits at <|startoftranscript|> as a transcription's first
window asks for them (Whisper's no-speech check; ``--no-speech-off``: without, so the prompt goes through
the prompt pass); ``--timestamps``: with Whisper's timestamp rules, as long-form windows decode;
``--plain`` decodes without the assistant. Prints operations a
round and, with ``--where``, the 30 busiest Python lines of the engine (``--ops``: the 60 busiest lines and
operations).

    .venv/bin/python .ci/round-ops.py [--files N] [--lookahead constant:3] [--plain] [--timestamps] [--where [--ops]]
"""
import argparse
import sys
import traceback
from collections import Counter

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, ".")
from pipelines.asr import TranscribeOptions, WhisperRunner  # noqa: E402
from pipelines.audio import load_audio  # noqa: E402
from pipelines.devices import resolve_device  # noqa: E402
from pipelines.engine import (  # noqa: E402, I001
    AssistedDecoder,
    DecodeOptions,
    as_decoder,
    graphs,
    model_drafter,
    rows as row_ops,  # noqa: E402
)
from pipelines.engine.policies import parse_policy  # noqa: E402
from pipelines.engine.whisper import CUDA_SHAPE, WhisperDecoder  # noqa: E402
from pipelines.models.registry import load_registry  # noqa: E402
from pipelines.quality.sets import read_manifest  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--files", type=int, default=4)
parser.add_argument("--lookahead", default="constant:3")
parser.add_argument("--plain", action="store_true")
parser.add_argument("--where", action="store_true")
parser.add_argument("--ops", action="store_true", help="with --where: each line's operations by name")
parser.add_argument("--no-speech-off", action="store_true", help="decode without the no-speech check's logits")
parser.add_argument("--timestamps", action="store_true", help="with Whisper's timestamp rules (a long-form window's)")
args = parser.parse_args()

torch.set_num_threads(1)
row_ops.indexed = lambda device: True
runner = WhisperRunner(load_registry().get("whisper-base+distilled"), "float32", resolve_device("cpu"))
loaded = runner.loaded
main = WhisperDecoder(loaded.main_model, width=CUDA_SHAPE.width)
main.graphs = "eager"
lean = as_decoder(loaded.assistant_model, assistant=True)
lean.graphs = "eager"
eot = loaded.main_model.generation_config.eos_token_id
engine = AssistedDecoder(main, None if args.plain else model_drafter(lean, share_encoder=True, pad_id=eot), pad_id=eot)
prompt = runner.prompt("en", "transcribe", args.timestamps)
options = TranscribeOptions(device=resolve_device("cpu"))
rules = runner.rules(len(prompt), args.timestamps, options.max_new_tokens)
# as a transcription's first window decodes: with Whisper's no-speech check (the logits at <|startoftranscript|>)
sot = prompt.index(loaded.main_model.generation_config.decoder_start_token_id)
decode = DecodeOptions(max_new_tokens=options.max_new_tokens, policy=parse_policy(args.lookahead),
                       logits_at=None if args.no_speech_off else sot)
encoded = [runner.encode_windows([load_audio(i["audio_path"]).astype(np.float32)])[0]
           for i in read_manifest("speech-real")[: args.files]]

show_sites, show_ops = args.where, args.ops  # (``args`` is a parameter name below)
counting = {"on": False, "ops": 0}
sites: Counter = Counter()


class CountOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if counting["on"]:
            counting["ops"] += 1
            if show_sites:
                frames = [f for f in traceback.extract_stack(limit=40) if "/pipelines/" in f.filename]
                site = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"
                sites[f"{site} {func.__name__}" if show_ops else site] += 1
        return func(*args, **(kwargs or {}))


def replay_uncounted(self, *inputs):
    """``PassGraph.__call__`` with its run (a graph's body) not counted."""
    for buffer, value in zip(self.inputs, inputs):
        buffer.copy_(value, non_blocking=True)
    was, counting["on"] = counting["on"], False
    try:
        self.output = self.run(*self.inputs)
    finally:
        counting["on"] = was
    return self.output


graphs.PassGraph.__call__ = replay_uncounted
for enc in encoded:  # warm: caches pooled, graphs made
    engine.generate([prompt], rules, decode, encoder_output=enc)
rounds = tokens = 0
with CountOps():
    for enc in encoded:
        counting["on"] = True
        stats = engine.generate([prompt], rules, decode, encoder_output=enc).stats
        counting["on"] = False
        rounds, tokens = rounds + stats.rounds, tokens + stats.new_tokens
what = "plain" if args.plain else args.lookahead
print(f"{len(encoded)} speech-real files, {what}: {rounds} rounds, {tokens} tokens, {counting['ops']} operations, "
      f"{counting['ops'] / rounds:.1f} a round")
for site, n in sites.most_common(60 if args.ops else 30):
    print(f"  {n / rounds:6.1f} a round  {site}")

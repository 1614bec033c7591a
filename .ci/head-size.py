"""The shipped Whisper assistant with a smaller draft head, cut after training (issue 17): held-out and
speech-real agreement and simulated tokens per main call (lookahead 5) when its head keeps only the N most
frequent text tokens of the committed corpus's training shards (plus every special and timestamp token),
beside the draft cost of a token (``distill.student.draft_cost``). A cut head drafts exactly what the full
one drafts wherever the full one's choice is among the kept tokens (an argmax over fewer columns), so only
agreement lost to the cut tokens is measured here, without training again.

    .venv/bin/python .ci/head-size.py RUN [N ...]

RUN: a ``tandem distill`` run folder holding the held-out shard's features (shard 0), e.g. from
``tandem --threads 2 distill --main whisper-base --layers 2 --out RUN --clips 64 --steps 1 --device cpu``.
"""
import collections
import gzip
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, ".")
from pipelines.distill import resolve_main  # noqa: E402
from pipelines.distill.curve import real_shard  # noqa: E402
from pipelines.distill.options import HELDOUT_SHARD  # noqa: E402
from pipelines.distill.shards import read_shard  # noqa: E402
from pipelines.distill.student import draft_cost, evaluate_heldout, make_student  # noqa: E402
from pipelines.distill.teacher import Teacher  # noqa: E402
from pipelines.models.embedded import ASSISTANTS_DIR  # noqa: E402

run, sizes = Path(sys.argv[1]), [int(n) for n in sys.argv[2:]] or [12288, 8192, 4096]
torch.set_num_threads(2)
corpus = Path("data/distill/whisper-base")
counts: collections.Counter = collections.Counter()
for shard, entry in json.loads((corpus / "manifest.json").read_text())["shards"].items():
    if int(shard) != HELDOUT_SHARD:
        for clip in json.load(gzip.open(corpus / entry["file"])):
            counts.update(clip["labels"])
folder = ASSISTANTS_DIR / "whisper-base-distilled"
meta = json.loads((folder / "assistant.json").read_text())
teacher = Teacher(resolve_main("whisper-base"), "float32", "cpu")
special = [t for t in meta["draft_vocab"] if t >= teacher.tokenizer.eos_token_id]
text = set(meta["draft_vocab"]) - set(special)
ranked = [t for t, _ in counts.most_common() if t in text]  # the head's text tokens, most frequent first
student = make_student(teacher.model, meta["layers"]).float()
tensors = {k: v.float() for k, v in load_file(folder / "layers.safetensors").items()}
student.model.decoder.layers.load_state_dict({k[7:]: v for k, v in tensors.items() if k.startswith("layers.")})
student.model.decoder.layer_norm.load_state_dict({k[11:]: v for k, v in tensors.items() if k.startswith("layer_norm.")})
student.eval()
heldout, real = read_shard(run, HELDOUT_SHARD), real_shard(teacher)
print(f"shipped head: {len(meta['draft_vocab'])} tokens ({len(text)} text, {len(special)} special and timestamps)")
print("| text tokens kept | head | draft cost | held-out agreement / tokens per call (coverage) | "
      "speech-real agreement / tokens per call (coverage) |")
print("|---|---|---|---|---|")
for n in [len(ranked)] + sizes:
    vocab = sorted(set(ranked[:n]) | set(special))
    h, r = evaluate_heldout(student, heldout, vocab), evaluate_heldout(student, real, vocab)
    print(f"| {n:,} | {len(vocab):,} | {draft_cost(teacher.model.config, meta['layers'], len(vocab))} | "
          f"{h.agreement:.1%} / {h.tokens_per_call:.2f} ({h.coverage:.1%}) | "
          f"{r.agreement:.1%} / {r.tokens_per_call:.2f} ({r.coverage:.1%}) |", flush=True)

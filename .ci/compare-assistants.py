"""Exported Whisper-base assistants side by side on three held-out sets, teacher-forced as the learning curve
measures (``distill.student.evaluate_heldout``: agreement with Whisper base's greedy tokens, tokens per main
call at lookahead 5, head coverage), issue 17:

- descriptions: the corpus's held-out shard 0 (Debian descriptions; labels from the corpus, audio synthesised
  again from its recipes);
- fortunes: N clips drawn (fixed seed, the corpus's recipe mix of short clips and 30 s windows) from the
  fortunes the corpus holds out (``speech.is_heldout``; ``distill.heldout.fortune_items``, the same draw a
  training measures on at N = 96), labelled here by Whisper base in bfloat16 as the corpus is;
- speech-real: its clips of at most 30 s, labelled here by Whisper base in bfloat16.

    .venv/bin/python .ci/compare-assistants.py [--fortunes N] ASSISTANT...

ASSISTANT: ``shipped``, an exported assistant (a ``tandem distill`` run's folder or its assistant folder), or a
training checkpoint (``RUN/train/checkpoint.pt``: the last step's layers, the draft vocabulary of the ``best.pt``
beside it).
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, ".")
from pipelines.distill import DistillOptions, default_corpus, resolve_main  # noqa: E402
from pipelines.distill.corpus import Corpus  # noqa: E402
from pipelines.distill.curve import real_shard  # noqa: E402
from pipelines.distill.heldout import fortune_items  # noqa: E402
from pipelines.distill.shards import GROUP, Shard, SpeechSource, featurise  # noqa: E402
from pipelines.distill.speech import corpus_sentences, synthesis_versions  # noqa: E402
from pipelines.distill.student import draft_cost, evaluate_heldout, load_layers, make_student, start_folder  # noqa: E402
from pipelines.distill.teacher import Teacher  # noqa: E402
from pipelines.quality.sets import project_sentences  # noqa: E402
from pipelines.synthesis import Speaker  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("assistants", nargs="+")
parser.add_argument("--fortunes", type=int, default=96)
args = parser.parse_args()
torch.set_num_threads(2)
ref = resolve_main("whisper-base")
teacher = Teacher(ref, "bfloat16", "cpu")
corpus = Corpus(default_corpus(ref), teacher.name, synthesis_versions())
sentences = corpus_sentences(set(project_sentences()))
speaker, tmp = Speaker(), Path("/tmp/compare-assistants")
tmp.mkdir(exist_ok=True)


def as_shard(items, labels=None) -> Shard:
    hidden, mask, prompts, ys, ids, lps = featurise(teacher, items, 440, labels)
    meta = [{"prompt": p, "labels": y} for p, y in zip(prompts, ys)]
    offsets, acc = [], 0
    for y in ys:
        offsets.append(acc)
        acc += len(y)
    return Shard(hidden, mask, meta, ids, lps, offsets)


sets = {}
t0 = time.time()
items, labels = SpeechSource(DistillOptions(main="whisper-base", out=tmp), corpus, sentences, speaker, tmp).items(0)
sets["descriptions"] = as_shard(items, labels)
pool = [r for r in sentences.heldout if r[0].startswith("fortunes/")]
fortunes = fortune_items(sentences, speaker, tmp / "f.wav", args.fortunes)  # the set a training measures on
sets["fortunes"] = as_shard(fortunes)
sets["speech-real"] = real_shard(teacher, max_new=440)
print(f"sets built in {time.time() - t0:.0f} s: " + ", ".join(
    f"{k} {len(s.items)} clips / {sum(len(m['labels']) for m in s.items)} tokens" for k, s in sets.items()), flush=True)
print(f"(fortune pool: {len(pool)} held-out fortunes; {sum(it['kind'] == 'clip' for it in fortunes)} short clips, "
      f"{sum(it['kind'] != 'clip' for it in fortunes)} windows; GROUP {GROUP})")

print("| assistant | head | draft cost | " + " | ".join(sets) + " |")
print("|---|---|---|" + "---|" * len(sets))
def load_assistant(name: str):
    """(student, its draft vocabulary, a label): an exported assistant or a training checkpoint."""
    if name.endswith(".pt"):
        saved = torch.load(name, weights_only=False, map_location="cpu")
        vocab = torch.load(Path(name).with_name("best.pt"), weights_only=False, map_location="cpu")["vocab"]
        layers = sum(k.endswith("self_attn.k_proj.weight") for k in saved["student"])
        student = make_student(teacher.model, layers).float()
        assert not student.load_state_dict(saved["student"], strict=False).unexpected_keys
        return student, vocab, layers, f"step {saved['state']['step']}"
    folder = start_folder(name, ref)
    meta = json.loads((folder / "assistant.json").read_text())
    student = make_student(teacher.model, meta["layers"]).float()
    load_layers(student, folder)
    return student, meta["draft_vocab"], meta["layers"], meta["sha256"][:12]


for name in args.assistants:
    student, vocab, layers, label = load_assistant(name)
    student.eval()
    cells = []
    for shard in sets.values():
        got = evaluate_heldout(student, shard, vocab)
        cells.append(f"{got.agreement:.1%} / {got.tokens_per_call:.2f} ({got.coverage:.1%})")
    cost = draft_cost(teacher.model.config, layers, len(vocab))
    print(f"| {name} ({label}) | {len(vocab)} | {cost} | " + " | ".join(cells) + " |", flush=True)

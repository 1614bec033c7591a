"""The shipped Whisper assistant's agreement with Whisper base by the corpus's text source (issue 17): short
clips of the committed corpus whose sentences are all fortunes against those whose sentences are all Debian
descriptions, from shard FIRST on (the shards that draw fortunes), N of each; labels from the corpus, audio
synthesised again from the recipes, measured teacher-forced as the learning curve measures
(``distill.student.evaluate_heldout``: agreement, tokens per main call at lookahead 5, head coverage).

    .venv/bin/python .ci/source-agreement.py [FIRST [N]]      (defaults 317, 48)
"""
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

sys.path.insert(0, ".")
from pipelines.distill import resolve_main  # noqa: E402
from pipelines.distill.corpus import Corpus  # noqa: E402
from pipelines.distill.shards import Shard, _item  # noqa: E402
from pipelines.distill.speech import corpus_sentences, render  # noqa: E402
from pipelines.distill.student import evaluate_heldout, make_student  # noqa: E402
from pipelines.distill.teacher import Teacher  # noqa: E402
from pipelines.models.embedded import ASSISTANTS_DIR  # noqa: E402
from pipelines.quality.sets import project_sentences  # noqa: E402
from pipelines.synthesis import Speaker  # noqa: E402

torch.set_num_threads(1)
folder = Path("data/distill/whisper-base")
manifest = json.loads((folder / "manifest.json").read_text())
corpus = Corpus(folder, manifest["teacher"], manifest["synthesis"])
text = corpus_sentences(set(project_sentences())).text
teacher = Teacher(resolve_main("whisper-base"), "bfloat16", "cpu")
speaker, tmp = Speaker(), Path("/tmp/source-agreement.wav")
groups = {"fortunes": [], "descriptions": []}
first = int(sys.argv[1]) if len(sys.argv) > 1 else 317
per = int(sys.argv[2]) if len(sys.argv) > 2 else 48
for s in [int(k) for k in manifest["shards"] if int(k) >= first]:
    for clip in corpus.read(s):
        r = clip.recipe
        if r.kind != "clip" or any(x not in text for x in r.sentences):
            continue
        kinds = {x[0].startswith("fortunes/") for x in r.sentences}
        if len(kinds) == 1:
            g = groups["fortunes" if kinds.pop() else "descriptions"]
            if len(g) < per:
                g.append((r, list(clip.labels)))
print({k: len(v) for k, v in groups.items()}, flush=True)
meta = json.loads((ASSISTANTS_DIR / "whisper-base-distilled" / "assistant.json").read_text())
student = make_student(teacher.model, meta["layers"]).float()
t = {k: v.float() for k, v in load_file(ASSISTANTS_DIR / "whisper-base-distilled" / "layers.safetensors").items()}
student.model.decoder.layers.load_state_dict({k[7:]: v for k, v in t.items() if k.startswith("layers.")})
student.model.decoder.layer_norm.load_state_dict({k[11:]: v for k, v in t.items() if k.startswith("layer_norm.")})
student.eval()
for name, clips in groups.items():
    t0 = time.time()
    items = [_item(r, text, render(r, text, speaker, tmp)) for r, _ in clips]
    labels = [y for _, y in clips]
    h, m, prompts, ys = teacher.features(items, 440, labels)
    shard = Shard(h, None, [{"prompt": p, "labels": y} for p, y in zip(prompts, ys)], np.zeros((0, 0), np.int32),
                  np.zeros((0, 0), np.float16), list(np.cumsum([0] + [len(y) for y in ys])[:-1]))
    got = evaluate_heldout(student, shard, meta["draft_vocab"])
    print(f"{name}: {len(items)} clips, {sum(map(len, ys))} tokens: agreement {got.agreement:.1%}, "
          f"{got.tokens_per_call:.2f} tokens per call, coverage {got.coverage:.1%} ({time.time() - t0:.0f} s)", flush=True)

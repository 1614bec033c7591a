"""Distil a small assistant for a main model that has none (sequence-level knowledge distillation, the way
distil-whisper was made), resumably and within a time budget, on the CPU or a GPU.

corpus   ASR: sentences of Debian package descriptions that no evaluation set holds, spoken by varied voices
         (``speech``): a short clip of 1-2 sentences (decoded with <|notimestamps|>) or a 30 s window of
         sentences and pauses (decoded with timestamps, as long-form transcription asks). The labelled
         corpus lives in the repository (``corpus``: recipes and token ids, data/distill/<model>/) and grows
         from run to run: shards it holds are synthesised again, not labelled again.
         Text models: source lines from the given text files.
label    the main model's own greedy output, decoded by Tandem's batched engine (``teacher``); the training
         features (encoder output, teacher top-8) go to the run's folder in shards (``shards``). Shard 0 is
         held out; Whisper runs also measure on held-out fortunes labelled at run time (``heldout``).
train    ``student``: a shallow decoder initialised from the main decoder's layers, trained on CE + KL.
export   ``export``: the assistant folder and its card. A run that went on from an assistant (``--start``)
         carries the start's card forward and records its point of the corpus's learning curve (``lineage``).
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import replace
from pathlib import Path

from ..models.loading import ModelRef
from .corpus import default_corpus
from .heldout import FORTUNES, build_fortunes
from .options import HELDOUT_SHARD, TOPK, DistillError, DistillOptions, HeldOut
from .shards import Shard, build_features, grow_corpus, read_shard, shard_done
from .student import spread_layers
from .teacher import Teacher, is_whisper_ref
from .training import train

__all__ = ["DistillError", "DistillOptions", "HeldOut", "Shard", "TOPK", "distill", "read_shard", "resolve_main",
           "spread_layers", "default_corpus", "corpus_labelled", "drafting_pair", "labelling_teacher"]


def resolve_main(name: str) -> ModelRef:
    """A pair name gives its main model; otherwise an embedded name, an existing folder, or a hub id."""
    from ..models.embedded import embedded_names
    from ..models.registry import load_registry

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


def drafting_pair(ref: ModelRef, log=print):
    """The registry pair that labels faster for a Whisper main model ``ref``: the task's default pair when its
    main is ``ref``, else the first pair over ``ref`` whose assistant reads its encoder output (test pairs left
    out), with all its models available offline now; None (plain decoding) when there is none or ``ref`` is
    not Whisper. Its drafts never change a label: Whisper's fixed-shape main decoder gives plain greedy
    decoding's tokens whatever drafts."""
    from ..models.registry import RegistryError, load_registry, missing_offline

    if not is_whisper_ref(ref):
        return None
    try:
        registry = load_registry()
    except (RegistryError, OSError) as e:  # a broken models.yaml costs speed here, not the run
        log(f"labelling without an assistant: {e}")
        return None
    # the teacher passes the assistant the main encoder's output, no encoder inputs of its own
    candidates = [p for p in registry.pairs.values() if p.main == ref and p.assistant is not None
                  and p.draft.startswith("model") and p.share_encoder and not p.test_only]
    defaults = set(registry.defaults.values())
    for pair in sorted(candidates, key=lambda p: p.name not in defaults):
        if not missing_offline(pair):
            return pair
    return None


def labelling_teacher(ref: ModelRef, dtype: str, device: str, log=print) -> Teacher:
    """The teacher that decodes new labels: with ``drafting_pair``'s assistant drafting where it loads, else
    plain (an assistant that cannot be had costs speed, not the run)."""
    from ..models.loading import ModelUnavailableError

    drafting = drafting_pair(ref, log)
    if drafting is not None:
        try:
            teacher = Teacher(ref, dtype, device, drafting)
        except ModelUnavailableError as e:
            log(f"labelling without pair {drafting.name!r}'s assistant: {e}")
        else:
            log(f"new labels are decoded with pair {drafting.name!r}'s assistant drafting (equal to plain greedy decoding's)")
            return teacher
    return Teacher(ref, dtype, device)


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


def features_teacher(teacher: Teacher, opts: DistillOptions, log) -> Teacher:
    """The teacher that encodes clips whose labels the corpus already holds (and gives their top-k): the
    labelling teacher itself where its dtype runs natively on the device, else the main model in float32
    (on a CPU without bfloat16 units bfloat16 is emulated, several times slower than float32; new labels
    keep the corpus's dtype, only the training features change precision)."""
    from ..devices import half_is_native

    if opts.label_only or teacher.dtype == "float32" or half_is_native(opts.device, teacher.dtype):
        return teacher
    log(f"this CPU has no {teacher.dtype} units (/proc/cpuinfo): new labels in {teacher.dtype} (the corpus's "
        f"teacher) run several times slower than float32 here; clips the corpus already labels are encoded in "
        "float32")
    return Teacher(teacher.ref, "float32", opts.device)  # it decodes no label: no assistant


def build_corpus(opts: DistillOptions, teacher: Teacher, deadline: float | None, log,
                 reader: Teacher | None = None) -> int:
    """Build the training features of the held-out shard and of ``opts.clips`` training items (or until the
    deadline); returns the number of training shards done. Each shard is written atomically, so a stopped
    run loses at most one. ``reader`` (default ``teacher``) encodes the clips whose labels the corpus holds."""
    shards = [HELDOUT_SHARD, *opts.training_shards]
    held = not teacher.is_whisper or opts.curve or shard_done(opts.out, FORTUNES)  # else the held-out fortunes may be due
    if not opts.label_only and held and all(shard_done(opts.out, s) for s in shards):
        return len(shards) - 1
    tmp = opts.out / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    if teacher.is_whisper:
        from ..quality.sets import project_sentences
        from ..synthesis import Speaker
        from .corpus import Corpus, CorpusError
        from .shards import SpeechSource
        from .speech import corpus_sentences, synthesis_versions

        try:
            corpus = Corpus(opts.corpus or default_corpus(teacher.ref), teacher.name, synthesis_versions())
        except CorpusError as e:
            raise DistillError(str(e)) from None
        # one Piper thread, sleeping when idle: the next shard is synthesised while the model labels this one
        source = SpeechSource(opts, corpus, corpus_sentences(set(project_sentences())), Speaker(piper_threads=1), tmp)
        log(f"corpus {corpus.folder}: {len(corpus.shards())} shards committed "
            f"({sum(corpus.entry(s)['items'] for s in corpus.shards())} clips)")
        try:
            if opts.label_only:  # the corpus only: its shards count, no training features
                return grow_corpus(teacher, source.items, shards, 440, deadline, log, corpus) - corpus.has(HELDOUT_SHARD)
            done = build_features(opts, teacher, source.items, shards, 440, deadline, log, corpus, reader)
            if done == len(shards) and not opts.curve:  # a curve's sizes stay chosen on shard 0, as its record's
                build_fortunes(opts.out, teacher, source.sentences, source.speaker, tmp, opts.heldout, deadline, log)
        except CorpusError as e:
            raise DistillError(str(e)) from None
        if source.skipped:
            log(f"corpus: {source.skipped} clips skipped (their sentences left Debian's index)")
        if source.changed:
            then, now = corpus.manifest.get("synthesis"), synthesis_versions()
            log(f"corpus: {len(source.changed)} of the checked clips sound different from when they were labelled "
                f"({', '.join(source.changed[:6])}; synthesis then {then}, now {now}): labels kept")
        return done - shard_done(opts.out, HELDOUT_SHARD)
    lines = read_text_lines(opts.data)
    random.Random(opts.seed).shuffle(lines)
    pool = max(1, min(len(lines) // 5, 500))

    def make(s: int):
        return text_items(s, opts.heldout if s == HELDOUT_SHARD else opts.shard_size, lines, pool, opts.seed), None

    max_new = min(int(getattr(teacher.gen, "max_length", 128) or 128), 256)
    return build_features(opts, teacher, make, shards, max_new, deadline, log) - shard_done(opts.out, HELDOUT_SHARD)


def corpus_holds(folder: Path, shards) -> bool:
    """Whether the committed corpus in ``folder`` labels every one of ``shards`` (False when its manifest is
    missing or unreadable: the corpus itself then says why, ``Corpus``)."""
    try:
        held = json.loads((folder / "manifest.json").read_text()).get("shards", {})
    except (OSError, ValueError, AttributeError):
        return False
    return all(str(s) in held for s in shards)


def corpus_labelled(opts: DistillOptions) -> bool:
    """Whether every shard ``opts`` asks for is labelled: in the committed corpus (Whisper, ``label_only``),
    else as training features in the run's folder."""
    wanted = [HELDOUT_SHARD, *opts.training_shards]
    folder = opts.corpus or default_corpus(resolve_main(opts.main))
    if opts.label_only and (folder / "manifest.json").is_file():
        return corpus_holds(folder, wanted)
    return all(shard_done(opts.out, s) for s in wanted)


def teacher_for(opts: DistillOptions, ref: ModelRef, whisper: bool, dtype: str, log) -> Teacher:
    """The teacher of this run: ``labelling_teacher`` (an assistant drafting) where the run has clips to label,
    the plain main model where the committed corpus already labels every shard it asks for (no assistant
    loaded for nothing, nor kept beside the feature reader)."""
    if whisper and corpus_holds(opts.corpus or default_corpus(ref), [HELDOUT_SHARD, *opts.training_shards]):
        return Teacher(ref, dtype, opts.device)
    return labelling_teacher(ref, dtype, opts.device, log)


def curve_options(opts: DistillOptions) -> DistillOptions:
    """With ``--curve``: the corpus to the largest size, and every size trained as long as the largest would be
    at ``epochs`` (unless ``steps`` says)."""
    if not opts.curve:
        return opts
    return replace(opts, clips=max(opts.curve),
                   steps=opts.steps if opts.steps is not None else max(1, int(opts.epochs * max(opts.curve) / opts.batch_size)))


def check_curve(opts: DistillOptions, whisper: bool) -> None:
    """What a learning curve needs, checked before anything is labelled (DistillError): a Whisper main model,
    sizes of whole shards (a size's students train on exactly its first N clips), at least one step and a
    built speech-real set to measure on."""
    if opts.steps is not None and opts.steps < 1:
        raise DistillError(f"--steps {opts.steps}: at least one optimizer step")
    if opts.drafter not in ("student", "medusa"):
        raise DistillError(f"--drafter {opts.drafter!r}: student or medusa")
    if opts.drafter == "medusa" and not opts.curve:
        raise DistillError("--drafter medusa is a study design, measured in a learning curve (--curve N,...): the "
                           "engine has no drafter that reads the main decoder's hidden state, so there is nothing to export")
    if opts.drafter == "medusa" and opts.heads < 1:
        raise DistillError(f"--heads {opts.heads}: at least one head")
    if opts.shards and (opts.curve or min(opts.shards) <= HELDOUT_SHARD):
        raise DistillError("--shards names training shards (1 and up; shard 0 is held out), and a learning curve "
                           "trains on the first N clips of the corpus: --shards and --curve do not go together")
    if opts.start is not None:
        check_start(opts, whisper)
        if not opts.label_only:  # (labelling alone measures nothing)
            check_real_set("--start")
    if not opts.curve:
        return
    if not whisper:
        raise DistillError("--curve measures on speech-real: Whisper main models only")
    odd = [n for n in opts.curve if n % opts.shard_size]
    if odd:
        raise DistillError(f"--curve {','.join(map(str, odd))}: sizes are whole shards of {opts.shard_size} clips "
                           f"(e.g. {','.join(str(max(1, round(n / opts.shard_size)) * opts.shard_size) for n in odd)})")
    check_real_set("--curve")


def check_real_set(option: str) -> None:
    """A run that records a point of the learning curve (``--curve``, ``--start``) measures it on speech-real:
    DistillError where that set is not built."""
    from ..quality.sets import DataBuildError, read_manifest
    from .curve import REAL_SET

    try:
        read_manifest(REAL_SET)
    except DataBuildError as e:
        raise DistillError(f"{option} measures on {REAL_SET}: {e}") from None


def check_start(opts: DistillOptions, whisper: bool) -> None:
    """What ``--start`` needs (DistillError): a Whisper main model, a student (not Medusa heads, nor a learning
    curve, whose sizes all start from the main model's layers) and an exported assistant for this main model
    with ``opts.layers`` layers (``student.start_folder``)."""
    from .student import read_start

    if not whisper or opts.drafter != "student" or opts.curve or opts.init != "spread":
        raise DistillError("--start goes on training an exported Whisper assistant: a student (not --drafter medusa, "
                           "--init or --curve, which start from the main model's own layers)")
    read_start(opts.start, resolve_main(opts.main), opts.layers)


def distill(opts: DistillOptions, log=print) -> Path | None:
    """Corpus -> labels -> training -> export, resumable. Returns the assistant folder, or None when the
    budget ran out before training finished (``--resume`` goes on) or ``label_only`` stopped before it."""
    import torch

    from ..devices import resolve_dtype
    from .export import export

    if opts.threads:
        torch.set_num_threads(opts.threads)
    opts = curve_options(opts)
    ref = resolve_main(opts.main)
    whisper = is_whisper_ref(ref)
    check_curve(opts, whisper)  # before the folder records a plan: a refused command can be corrected and run again
    plan_path = opts.out / "plan.json"
    design = ({"drafter": opts.drafter, "heads": opts.heads} if opts.drafter == "medusa"
              else {"layers": opts.layers, **({"init": opts.init} if opts.init != "spread" else {})})
    design.update({k: v for k, v in (("start", opts.start), ("shards", list(opts.shards))) if v})
    if opts.start is not None:  # the start's layers: a run resumed after "shipped" changed is another run
        from .student import read_start

        design["start_sha256"] = read_start(opts.start, ref, opts.layers)[1]["sha256"]
    plan = {"main": opts.main, **design,
            "data": list(opts.data), "seed": opts.seed,
            "shard_size": opts.shard_size, "heldout": opts.heldout, **({"corpus": str(opts.corpus)} if opts.corpus else {})}
    if plan_path.is_file():
        if not opts.resume:
            raise DistillError(f"{opts.out} holds an earlier run: pass --resume to go on, or choose another --out")
        if json.loads(plan_path.read_text()) != plan:
            raise DistillError(f"{opts.out} was made with other options ({plan_path}); choose another --out")
    opts.out.mkdir(parents=True, exist_ok=True)
    plan_path.write_text(json.dumps(plan, indent=1))
    deadline = time.time() + opts.budget_minutes * 60 if opts.budget_minutes else None
    # Whisper is labelled in bfloat16 (4x faster encoder on these CPUs; float16 on a GPU without bfloat16);
    # text models and all training in float32
    label_dtype = resolve_dtype(opts.device, None, "bfloat16") if whisper else "float32"
    teacher = teacher_for(opts, ref, whisper, label_dtype, log)
    reader = features_teacher(teacher, opts, log)
    done = build_corpus(opts, teacher, deadline, log, reader)
    n_train = len(opts.training_shards)
    if done < n_train:
        log(f"corpus: {done}/{n_train} shards labelled when the budget ran out; resume with --resume")
        return None
    if opts.label_only:
        log(f"corpus: {done} training shards labelled (--label-only: no training)")
        return None
    if opts.curve:
        return run_curve(opts, ref, reader, deadline, log)
    if teacher.model.dtype != torch.float32:
        teacher = reader if reader.dtype == "float32" else Teacher(ref, "float32", opts.device)
    state = train(opts, teacher, opts.training_shards, deadline, log)
    if not state["finished"]:
        if state["step"] > 0 and (opts.out / "train" / "best.pt").is_file():  # never the untrained start alone
            export(opts, teacher, state, log)
        return None
    if opts.start is not None:  # its point of the corpus's learning curve, counted over its lineage
        from .lineage import lineage_point

        sizes, shipped = lineage_point(opts, teacher, reader, state, opts.corpus or default_corpus(ref), log)
        return export(opts, teacher, state, log, sizes=sizes, shipped=shipped)
    return export(opts, teacher, state, log)


def run_curve(opts: DistillOptions, ref: ModelRef, label_teacher: Teacher, deadline: float | None, log) -> Path | None:
    """The learning curve over ``opts.curve`` (``curve``), then the largest size's student exported;
    ``label_teacher`` (``features_teacher``'s) labels speech-real for the measurements."""
    from dataclasses import asdict

    import torch

    from .curve import learning_curve, name_rows
    from .export import export

    train_teacher = label_teacher if label_teacher.dtype == "float32" else Teacher(ref, "float32", opts.device)
    measured = learning_curve(opts, label_teacher, train_teacher, opts.corpus or default_corpus(ref), deadline, log)
    if measured is None:
        return None
    points, shipped, sizes = measured
    if opts.drafter == "medusa":  # measured only: no engine drafter reads the main's hidden state
        return opts.out
    largest = opts.out / "curve" / str(max(opts.curve))
    state = torch.load(largest / "checkpoint.pt", weights_only=False, map_location="cpu")["state"]
    sizes, shipped = name_rows(sizes, asdict(points[-1]), shipped)
    return export(opts, train_teacher, state, log, largest, sizes, shipped)

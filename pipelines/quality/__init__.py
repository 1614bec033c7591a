"""What a run is measured on and against: the offline evaluation sets (``sets``), the metrics with their
signatures (``metrics``), ``tandem eval`` (``evaluation``), ``tandem regress`` and its history (``regress``,
``history``) and the benchmarks (``bench``, ``bench_asr``, ``bench_shapes``, ``bench_text``, ``bench_vad``).
They call the task modules and the engine and measure what those return."""

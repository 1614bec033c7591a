"""Tandem: assisted (speculative) decoding for speech recognition, translation and summarization.

The package is organised one module or package a concern (docs/architecture.md lists them all):

- ``engine``    assisted decoding (draft, verify, accept): knows nothing of audio, files or UI;
- ``models``    the pair registry (``models.yaml``), model loading, pairs, the embedded weights;
- ``asr``, ``text``  the tasks: preprocess -> engine -> postprocess;
- ``audio``     decoding any audio or video file to 16 kHz mono float32;
- ``quality``   the evaluation sets, metrics (each score with a reproducible signature), tandem eval,
  regress and bench;
- ``distill``   making an assistant for a main model that has none;
- ``scale``     the batch job on Ray;
- ``serve``     ``tandem serve``, the OpenAI-compatible HTTP server;
- ``cli``       the ``tandem`` command.
"""

__version__ = "0.1.0"

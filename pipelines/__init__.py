"""Tandem: assisted (speculative) decoding for speech recognition, translation and summarization.

The package is organised one module a concern:

- ``registry``  the pair registry (``models.yaml``), its validation and the pre-flight checks;
- ``embedded``  Whisper weights shipped inside registry packages, converted and cached;
- ``loading``   turning a model reference (hub id, local folder, embedded name) into objects;
- ``audio``     decoding any audio or video file to 16 kHz mono float32;
- ``quality``   the evaluation sets, metrics (each score with a reproducible signature), tandem eval,
  regress and bench;
- ``asr``       the speech-recognition task (preprocess -> decode -> postprocess);
- ``cli``       the ``tandem`` command.
"""

__version__ = "0.1.0"

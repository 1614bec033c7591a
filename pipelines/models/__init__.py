"""Which models a run uses and how they are had: the pair registry (``registry``: models.yaml, its
validation and pre-flight), model references turned into configs, tokenizers and models (``loading``), a
registry pair loaded and turned into engines (``pairs``), the weights shipped in registry packages
(``embedded``: Whisper from CTranslate2 files, read by ``ct2`` and converted by ``convert``;
``embedded_gguf``: the text pair from GGUF parts) and the checked cache they are converted into (``cache``)."""

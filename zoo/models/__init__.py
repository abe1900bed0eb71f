"""The models layer: the decoder-only language model (:mod:`.language`), the encoder-decoder
(:mod:`.seq2seq`), what they share (:mod:`.base`), model configs (:mod:`.config`) and sampling
(:mod:`.generate`). Builds on ``zoo.assembly``.
"""

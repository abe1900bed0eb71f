"""The assembly layer: block configs validated into tensor-free specs (:mod:`.spec`), the
compatibility map (:mod:`.compat`), parameter matching (:mod:`.match`), building (:mod:`.build`),
the block itself (:mod:`.block`), controlled initialization (:mod:`.init`) and Hydra composition
(:mod:`.compose`). Builds on ``zoo.core`` and ``zoo.parts``.
"""

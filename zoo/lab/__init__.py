"""The lab: trains models built by ``zoo.models``, keeps what they did and compares them. Its rooms, in the
order a run's data flows through them (docs/why.md, "A map of the lab"; import-linter keeps each importing
only those below it): :mod:`.data`, :mod:`.tasks` and :mod:`.recipe`; :mod:`.records`; :mod:`.planning`;
:mod:`.training`; :mod:`.studies`; :mod:`.finished` and :mod:`.reports`; :mod:`.commands`. Beside them
:mod:`.files`, :mod:`.cores` and :mod:`.keys`, which import none of them. Nothing below ``zoo.lab`` imports it.
"""

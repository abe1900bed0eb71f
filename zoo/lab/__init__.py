"""The lab: training (:mod:`.train`, :mod:`.trainer`), tasks (:mod:`.tasks`), run records
(:mod:`.records`), sweeps (:mod:`.sweep`), reports and plots (:mod:`.report`, :mod:`.plots`) and the
command lines. Builds on ``zoo.models``; nothing below imports it.
"""

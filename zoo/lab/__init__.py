"""The lab: training (:mod:`.train` the run, :mod:`.plan` its config checked in one pass, :mod:`.trainer` the
loop, :mod:`.step` one training step), tasks (:mod:`.tasks`: data, scoring and the model each trains), run records
(:mod:`.records`), sweeps (:mod:`.sweep`), reports and plots (:mod:`.report`, :mod:`.plots`) and the
command lines. Builds on ``zoo.models``; nothing below imports it.
"""

"""A scaling ladder's answer (docs/sweeps.md#ladders): the study and its verdicts (``study``), the iso-loss
multiplier without a law (``iso``), the readings' simultaneous band (``band``), the noise by source (``noise``),
the secondary law (``law``), and planted ladders with known answers that hold the verdicts to their rates
(``planted``)."""

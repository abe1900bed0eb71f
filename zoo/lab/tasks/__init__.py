"""Training tasks: data generated or read at run time, nothing downloaded.

``bytes`` (byte-level language modelling on local text), ``tokens`` (token files),
``mqar`` (multi-query associative
recall) and ``transduce`` (reverse, sort or copy a sequence: encoder-decoder models); any task
can be evaluated at multiples of its trained length (``task.eval_lengths``).
"""

from zoo.lab.tasks import mqar, text, tokens, transduce  # noqa: F401  (registers the built-in tasks)
from zoo.lab.tasks.base import IGNORE, TASKS, Batch, Task, build_task, register_task

__all__ = ["IGNORE", "TASKS", "Batch", "Task", "build_task", "register_task"]

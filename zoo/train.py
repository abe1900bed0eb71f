"""``python -m zoo.train`` (and ``torchrun ... -m zoo.train``): the ``zoo-train`` command."""

from zoo.lab.commands.train import main

if __name__ == "__main__":
    main()

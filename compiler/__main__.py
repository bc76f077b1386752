"""``python -m b12x_aot.compiler`` is ``b12x-compile``."""

from .cli import main

if __name__ == "__main__":
    main()

"""``python -m b12x_aot.registry`` is ``b12x-registry``."""

from .cli import main

if __name__ == "__main__":
    main()

"""CuTe DSL kernels written the way the DSL's own examples write them, served by b12x-aot.

Nothing here was written for the registry: the classes take ``cute.Tensor`` arguments, are
built with their own constructor arguments, and their ``@cute.jit`` host functions compute
their tiled views, grids and shared memory themselves. ``examples/specs/`` names them.
Put ``examples/`` on ``PYTHONPATH`` to build them::

    PYTHONPATH=examples b12x-compile examples/specs/ --registry build/examples.db
"""

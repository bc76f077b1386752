"""CuTe DSL kernel sources that the specs name (``b12x_aot.kernels.<module>:<Class>``).

Importing this package imports nothing else: each family module imports the DSL itself, so
planning a build (which only hashes these files) never loads cutlass.
"""

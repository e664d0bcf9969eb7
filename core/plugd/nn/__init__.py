"""MLX layers shared by architecture plugins.

Every layer is built with placeholder parameters (lazy zeros or ones, never
evaluated) that the checkpoint's tensors replace at load, so building a model
allocates nothing.
"""

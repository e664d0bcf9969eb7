"""The runner process: loads one model with MLX and generates with it."""

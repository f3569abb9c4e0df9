"""Pieces shared by the examples: command line, training loop, data, checkpoints."""
